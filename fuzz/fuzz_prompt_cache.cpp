// libFuzzer target: the prompt-cache reader (engine/prompt_cache.cpp) on arbitrary
// files. Any input must either load a cache whose sizes match the model or throw
// vlm::Error (never allocate by a header's word, never read past the file).
// First byte even: the rest is the file. Odd: a valid cache with the rest XORed into
// it at the offset in bytes 1-2, so mutations reach the checks past the header.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "io/config.h"
#include "io/file.h"
#include "io/identity.h"
#include "engine/prompt_cache.h"

namespace {

const vlm::ModelConfig& config() {
  static const vlm::ModelConfig c = vlm::parse_config(
      R"({"architectures": ["Gemma3ForCausalLM"], "vocab_size": 16, "hidden_size": 8, "intermediate_size": 8,
          "num_hidden_layers": 2, "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 4,
          "sliding_window": 2, "max_position_embeddings": 64,
          "layer_types": ["sliding_attention", "full_attention"]})",
      "config.json");
  return c;
}
const vlm::Identity& identity() {
  static const vlm::Identity id = vlm::make_identity(config(), "F32", "causal", "f32-normalizer", "fuzz");
  return id;
}
const std::filesystem::path& scratch() {
  static const std::filesystem::path p =
      std::filesystem::temp_directory_path() / ("fuzz_prompt_cache." + std::to_string(::getpid()));
  return p;
}

// A valid cache of 3 positions, as bytes.
const std::string& valid() {
  static const std::string bytes = [] {
    vlm::KvCache c(config().text, 8, vlm::DType::F32);
    c.reserve(3);
    for (int l = 0; l < 2; ++l)
      for (int64_t p = 0; p < 3; ++p)
        for (size_t i = 0; i < c.row_size(); ++i) {
          const float v = float(p) + float(i);
          std::memcpy(c.key_slot(l, p) + 4 * i, &v, 4);
          std::memcpy(c.value_slot(l, p) + 4 * i, &v, 4);
        }
    c.advance(3);
    const std::vector<float> logits(16, 0.25f);
    vlm::save_prompt_cache(scratch(), identity(), 7, config().text, c, logits);
    return vlm::read_text_file(scratch());
  }();
  return bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string file;
  if (data[0] % 2 == 0 || size < 3) {
    file.assign(reinterpret_cast<const char*>(data) + 1, size - 1);
  } else {
    file = valid();
    size_t at = (size_t(data[1]) | size_t(data[2]) << 8) % file.size();
    for (size_t i = 3; i < size && at < file.size(); ++i, ++at) file[at] = char(file[at] ^ data[i]);
  }
  {
    std::ofstream f(scratch(), std::ios::binary | std::ios::trunc);
    f.write(file.data(), std::streamsize(file.size()));
  }
  try {
    const auto s = vlm::load_prompt_cache(scratch(), identity(), 7, config().text, 8, vlm::DType::F32, 16);
    if (s && (s->logits.size() != 16 || s->cache.length() <= 0 || s->cache.length() > 8)) std::abort();
  } catch (const vlm::Error&) {
  }
  return 0;
}
