// libFuzzer target: ModelConfig from GGUF metadata (io/gguf_config.h) on arbitrary file images.
// Input: a u32 (little-endian) n, then a text file image of n bytes, then an mmproj file image
// (the rest); where n does not fit, everything after it is the text file and there is no mmproj.
// Any input must either yield a config within config.h's bounds, consistent with itself, or
// throw vlm::Error.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>

#include "core/error.h"
#include "io/config.h"
#include "io/gguf.h"
#include "io/gguf_config.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

bool in(int64_t v, int64_t hi) { return v >= 1 && v <= hi; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vlm::config_limits;
  if (size < 4) return 0;
  uint32_t n;
  std::memcpy(&n, data, 4);
  const auto* p = reinterpret_cast<const std::byte*>(data) + 4;
  const size_t rest = size - 4;
  const bool two = n <= rest;
  try {
    const vlm::GgufHeader text = vlm::parse_gguf(std::span(p, two ? n : rest), "text.gguf");
    std::optional<vlm::GgufHeader> mm;
    if (two) mm = vlm::parse_gguf(std::span(p + n, rest - n), "mmproj.gguf");
    const vlm::ModelConfig c = vlm::config_from_gguf(text, mm ? &*mm : nullptr);
    const vlm::TextConfig& t = c.text;
    check(in(t.vocab_size, kMaxDim) && in(t.hidden_size, kMaxDim) && in(t.intermediate_size, kMaxDim));
    check(in(t.num_layers, kMaxLayers) && t.layer_kinds.size() == size_t(t.num_layers));
    check(in(t.num_heads, kMaxHeads) && in(t.num_kv_heads, kMaxHeads) && t.num_heads % t.num_kv_heads == 0);
    check(in(t.head_dim, kMaxHeadDim) && t.head_dim % 2 == 0);
    check(in(t.max_position_embeddings, kMaxPositions) && in(t.sliding_window, kMaxPositions));
    check(t.rms_norm_eps > 0 && t.rms_norm_eps <= kMaxEps && t.rope_theta > 1 && t.rope_theta <= kMaxScalar);
    check(c.pad_token_id >= 0 && c.pad_token_id < t.vocab_size);  // padding rows look it up
    for (int id : c.eos_token_ids) check(id >= 0 && id < t.vocab_size);
    if (c.vision) {
      const vlm::VisionConfig& v = *c.vision;
      check(in(v.image_size, kMaxSide) && in(v.patch_size, kMaxSide) && v.image_size % v.patch_size == 0);
      check(c.mm_tokens_per_image >= 1 && v.patches_per_side() % c.tokens_per_side() == 0);
      check(c.boi_token_id >= 0 && c.boi_token_id < t.vocab_size && c.eoi_token_id >= 0 &&
            c.eoi_token_id < t.vocab_size);
      const vlm::PreprocessorConfig& pp = *c.preprocessor;
      for (int i = 0; i < 3; ++i)
        check(pp.image_std[i] >= float(1 / kMaxPixelStat) && pp.image_std[i] <= kMaxPixelStat &&
              std::abs(pp.image_mean[i]) <= kMaxPixelStat);
    }
  } catch (const vlm::Error&) {
  }
  return 0;
}
