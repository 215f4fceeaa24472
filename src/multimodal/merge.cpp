#include "multimodal/merge.h"

#include <cmath>

#include "core/error.h"

namespace vlm {

std::string_view image_scaling_name(ImageScaling s) {
  return s == ImageScaling::Mlx ? "mlx" : "reference";
}

ImageScaling parse_image_scaling(std::string_view s) {
  if (s == "reference") return ImageScaling::Reference;
  if (s == "mlx") return ImageScaling::Mlx;
  fail("unknown image scaling '{}' (expected reference or mlx)", s);
}

void merge_image_rows(std::span<const int32_t> ids, int32_t image_token_id,
                      std::span<const float> features, int H, float pre_divisor, float sequence_scale,
                      float* rows) {
  const size_t h = size_t(H);
  size_t n_img = 0;
  for (int32_t id : ids) n_img += id == image_token_id;
  if (n_img * h != features.size())
    fail("image features and image tokens do not match: {} image tokens, {} feature rows", n_img,
         features.size() / h);
  const float* f = features.data();
  for (size_t r = 0; r < ids.size(); ++r) {
    if (ids[r] != image_token_id) continue;
    float* out = rows + r * h;
    for (size_t i = 0; i < h; ++i) out[i] = (f[i] / pre_divisor) * sequence_scale;
    f += h;
  }
}

std::vector<float> row_norms(const float* rows, size_t n, size_t H) {
  std::vector<float> out(n);
  for (size_t r = 0; r < n; ++r) {
    double s = 0;
    for (size_t i = 0; i < H; ++i) s += double(rows[r * H + i]) * double(rows[r * H + i]);
    out[r] = float(std::sqrt(s));
  }
  return out;
}

PrefillInput text_prefill(const TextEmbedder& emb, std::span<const int32_t> ids, int Lp, int window,
                          int32_t pad_id) {
  if (ids.empty()) fail("prefill: the prompt has no tokens");
  if (Lp < int(ids.size())) fail("prefill: pad length {} is shorter than the prompt ({})", Lp, ids.size());
  std::vector<int32_t> padded(ids.begin(), ids.end());
  padded.resize(size_t(Lp), pad_id);
  PrefillInput in;
  in.Lp = Lp;
  in.valid_len = int(ids.size());
  in.embeds = emb.embed(padded);
  PrefillMasks m = build_masks(MaskMode::Causal, std::span<const uint8_t>{}, in.valid_len, Lp, window);
  in.mask_global = std::move(m.global);
  in.mask_sliding = std::move(m.sliding);
  return in;
}

}  // namespace vlm
