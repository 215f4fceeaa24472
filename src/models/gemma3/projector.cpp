#include "models/gemma3/projector.h"

#include <cmath>

#include "core/error.h"
#include "kernels/ops.h"
#include "models/gemma3/registry.h"

namespace vlm::vision {

using models::gemma3::registry_tensor;

Projector::Projector(const Checkpoint& ck) {
  const ModelConfig& mc = ck.config();
  if (!mc.vision) fail("{}: config.json has no vision_config (not a Gemma 3 VLM)", ck.dir().string());
  const VisionConfig& v = *mc.vision;
  if (v.patch_size <= 0 || v.image_size <= 0 || v.image_size % v.patch_size != 0)
    fail("config.json: vision_config.image_size ({}) must be a positive multiple of patch_size ({})",
         v.image_size, v.patch_size);
  grid_ = v.image_size / v.patch_size;
  const int T = mc.mm_tokens_per_image;
  side_ = int(std::lround(std::sqrt(double(std::max(T, 0)))));
  if (T <= 0 || side_ * side_ != T)
    fail("config.json: mm_tokens_per_image ({}) must be a positive perfect square", T);
  if (grid_ % side_ != 0)
    fail("config.json: mm_tokens_per_image ({}): the {}x{} patch grid does not pool evenly to {}x{}", T,
         grid_, grid_, side_, side_);
  kernel_ = grid_ / side_;
  if (!(v.layer_norm_eps > 0)) fail("config.json: vision_config.layer_norm_eps must be positive");
  eps_ = float(v.layer_norm_eps);
  in_ = v.hidden_size;
  out_ = mc.text.hidden_size;
  if (out_ <= 0) fail("config.json: text_config.hidden_size must be positive");

  // The one [in, out] matrix of the model (spec §2.4).
  proj_ = kernels::as_weight(registry_tensor(ck, "projector.mm_input_projection_weight"));
  norm_w_ = registry_tensor(ck, "projector.mm_soft_emb_norm.weight").to_f32();
}

std::vector<float> Projector::forward(const float* vision, int n, const kernels::Exec& ex) const {
  const size_t D = size_t(in_), g = size_t(grid_), s = size_t(side_), k = size_t(kernel_);
  const size_t T = s * s, M = size_t(n) * T;
  std::vector<float> pooled(M * D, 0.f);
  const float count = float(k * k);
  ex.threads().parallel_for(M, [&](size_t lo, size_t hi) {
    for (size_t m = lo; m < hi; ++m) {
      const size_t img = m / T, i = (m % T) / s, j = m % s;
      float* o = &pooled[m * D];
      for (size_t r = i * k; r < i * k + k; ++r)
        for (size_t c = j * k; c < j * k + k; ++c) {
          const float* src = vision + ((img * g + r) * g + c) * D;
          for (size_t d = 0; d < D; ++d) o[d] += src[d];
        }
      for (size_t d = 0; d < D; ++d) o[d] /= count;
      kernels::rms_norm(o, norm_w_.data(), o, 1, D, eps_, ex.isa);
    }
  });
  std::vector<float> out(M * size_t(out_));
  kernels::matmul_kn(pooled.data(), M, proj_, out.data(), ex);
  return out;
}

}  // namespace vlm::vision
