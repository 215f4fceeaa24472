// libFuzzer target: config.json and preprocessor_config.json parsing on arbitrary
// text. Any input must either yield a validated config or throw vlm::Error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "io/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const vlm::ModelConfig c = vlm::parse_config(text, "config.json");
    if (c.text.layer_kinds.size() != size_t(c.text.num_layers)) std::abort();
    if (c.vision && c.vision->patches_per_side() % c.tokens_per_side() != 0) std::abort();
  } catch (const vlm::Error&) {
  }
  // The same bytes as a preprocessor config, against a fixed small VLM.
  static const vlm::ModelConfig vlm_config = vlm::parse_config(
      R"({"architectures": ["Gemma3ForConditionalGeneration"], "mm_tokens_per_image": 4,
          "boi_token_index": 5, "eoi_token_index": 6, "image_token_index": 7,
          "text_config": {"vocab_size": 16, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
                          "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 8},
          "vision_config": {"hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
                            "num_attention_heads": 1, "image_size": 16, "patch_size": 4}})",
      "base");
  try {
    vlm::parse_preprocessor_config(text, "preprocessor_config.json", vlm_config);
  } catch (const vlm::Error&) {
  }
  return 0;
}
