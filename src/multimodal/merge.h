// Input embedding rows at the prefill boundary (docs/gemma3/merge-and-scaling.md). Text rows are the token
// embedding times the Gemma normalizer √H; the decoder never scales again.
#pragma once
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace vlm {

// How image rows reach their magnitude (docs/gemma3/merge-and-scaling.md). Text rows are the
// TextEmbedder's in both policies; the net image magnitude is the projector output P.
enum class ImageScaling {
  // HF / Google: P written into the image positions unscaled. The default.
  Reference,
  // MLX's order of operations: image rows pre-divided by the normalizer, then every
  // row of the sequence multiplied by it (text rows by the TextEmbedder). The divisor
  // is the text normalizer itself, not mlx-vlm's defaulted top-level hidden_size 2048,
  // so the net image scale is 1 up to one f32 rounding.
  Mlx,
};
ImageScaling parse_image_scaling(std::string_view s);

// Overwrites the rows of `rows` [ids.size(), H] whose id is `image_token_id` with the
// projector features [n_image_tokens, H], in order, as (P / pre_divisor) · sequence_scale
// (Reference: 1 and 1, an exact copy; Mlx: the normalizer twice). Fails naming both
// numbers unless the counts agree.
void merge_image_rows(std::span<const int32_t> ids, int32_t image_token_id,
                      std::span<const float> features, int H, float pre_divisor, float sequence_scale,
                      float* rows);

// L2 norm of each of the n rows [n, H] (in double, returned as f32).
std::vector<float> row_norms(const float* rows, size_t n, size_t H);

}  // namespace vlm
