// Token embedding at the prefill boundary: text rows are the token embedding times the
// Gemma normalizer √H (transformers Gemma3TextScaledWordEmbedding); the decoder never
// scales again.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"

namespace vlm {

// How the normalizer is applied to text rows (spec §8.1/§8.5).
enum class EmbedScaling {
  // HF: √H (f32) cast to the weight dtype, the product rounded to the weight dtype
  // (bf16 4B: ×50.5 then bf16); for f32 weights plain f32 √H. The default.
  Reference,
  // E · f32(√H) in f32 whatever the weight dtype (llama.cpp's choice; an option).
  F32,
};

// Embeds token ids with a [V, H] table; ids outside [0, V) are an error naming the id.
class TextEmbedder {
 public:
  TextEmbedder(const TensorView& table, EmbedScaling scaling);
  int hidden() const { return int(hidden_); }
  // The normalizer actually used (after any rounding to the weight dtype).
  float normalizer() const { return scale_; }
  // rows [ids.size(), H], post-scale.
  void embed(std::span<const int32_t> ids, float* rows) const;
  std::vector<float> embed(std::span<const int32_t> ids) const;

 private:
  const TensorView* table_;
  EmbedScaling scaling_;
  size_t vocab_ = 0, hidden_ = 0;
  float scale_ = 0;
};

}  // namespace vlm
