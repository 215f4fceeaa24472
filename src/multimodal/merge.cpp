#include "multimodal/merge.h"

#include <cmath>

#include "core/error.h"

namespace vlm {

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

}  // namespace vlm
