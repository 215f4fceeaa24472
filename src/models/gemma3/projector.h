// The Gemma 3 multimodal projector (transformers Gemma3MultiModalProjector): average-pool the patch grid to
// sqrt(mm_tokens_per_image)² tokens, Gemma RMSNorm (1 + w) with the vision
// layer_norm_eps, then y = x · W with W = mm_input_projection_weight stored
// [in = vision hidden, out = text hidden].
#pragma once
#include <vector>

#include "io/checkpoint.h"
#include "kernels/exec.h"
#include "kernels/matmul.h"

namespace vlm::vision {

class Projector {
 public:
  // Checks mm_tokens_per_image, the patch grid and both tensors against the config.
  explicit Projector(const Checkpoint& ck);

  int tokens() const { return side_ * side_; }   // T = mm_tokens_per_image
  int out_dim() const { return out_; }           // text hidden size H

  // vision [n, P, in] (tower output) → [n, T, H].
  std::vector<float> forward(const float* vision, int n, const kernels::Exec& ex) const;
  double flops(int n) const { return 2.0 * n * tokens() * double(in_) * out_; }

 private:
  int grid_ = 0, side_ = 0, kernel_ = 0, in_ = 0, out_ = 0;
  float eps_ = 0;
  std::vector<float> norm_w_;
  kernels::Weight proj_;  // [in, out]
};

}  // namespace vlm::vision
