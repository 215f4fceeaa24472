// The SigLIP vision tower of Gemma 3 (docs/gemma3/vision.md#siglip): patch embedding (a matmul over
// unfolded patches), learned position embeddings, pre-norm encoder layers with
// unmasked multi-head attention and a gelu_tanh MLP, post-layernorm. Weights are
// views into the checkpoint in their stored dtype; activations are f32.
#pragma once
#include <vector>

#include "core/huge_pages.h"
#include "io/checkpoint.h"
#include "kernels/exec.h"
#include "kernels/matmul.h"
#include "nn/attention.h"

namespace vlm::vision {

// SigLIP's tensors (canonical names under `vision.`, shapes from the config), appended to
// `out`: the list checkpoint validation and SiglipTower both read.
void siglip_tensors(const VisionConfig& v, std::vector<TensorSpec>& out);

class SiglipTower {
 public:
  // Checks every vision_config value it uses against the tensors and each other;
  // errors name the field or tensor.
  explicit SiglipTower(const Checkpoint& ck);

  int image_size() const { return image_size_; }
  int patch_size() const { return patch_; }
  int patches_per_side() const { return image_size_ / patch_; }
  int num_patches() const { return patches_per_side() * patches_per_side(); }
  int hidden() const { return hidden_; }
  DType weight_dtype() const { return patch_w_.dtype; }

  // pixels [n, 3, S, S] (the processor's f32 output) → [n, P, hidden] after the
  // post-layernorm. The pixels are first rounded to the weight dtype, as HF casts
  // pixel_values to the tower's dtype before the patch convolution (docs/gemma3/preprocessing.md#dtype).
  std::vector<float> forward(const float* pixels, int n, const kernels::Exec& ex) const;

  // forward() in pieces, so a scheduler can run other work between encoder layers: begin()
  // embeds the patches, advance() runs up to `layers` more encoder layers (returns how many ran),
  // finish() applies the post-layernorm. The same operations in the same order: the same floats.
  struct Pass {
    std::vector<float> x;  // [n, P, hidden] residual stream
    int n = 0;
    size_t next = 0;       // the next encoder layer
    // advance()'s activations, sized once by begin(): the engine runs a few layers a step, and
    // allocating them on each call (165 MB of fresh pages for one 896x896 image) made an image
    // encoded 2 layers at a time take 17.3 s against 11.5 s in one call (2 threads, Zen 5 VM).
    HugePageVector<float> h, q, k, v, att, f;
    nn::AttnScratch work;
  };
  Pass begin(const float* pixels, int n, const kernels::Exec& ex) const;
  size_t advance(Pass& pass, size_t layers, const kernels::Exec& ex) const;
  bool done(const Pass& pass) const { return pass.next == layers_.size(); }
  std::vector<float> finish(Pass&& pass, const kernels::Exec& ex) const;
  int num_layers() const { return int(layers_.size()); }

  // Floating-point operations of forward() for n images (matmuls and attention).
  double flops(int n) const;

 private:
  struct Layer {
    std::vector<float> ln1_w, ln1_b, ln2_w, ln2_b;
    kernels::Weight q, k, v, o, fc1, fc2;
    std::vector<float> q_b, k_b, v_b, o_b, fc1_b, fc2_b;
  };
  int image_size_ = 0, patch_ = 0, hidden_ = 0, inter_ = 0, heads_ = 0;
  float eps_ = 0;
  kernels::Weight patch_w_;  // [hidden, 3·p·p], the OIHW kernel flattened
  std::vector<float> patch_b_, pos_;  // [hidden], [P, hidden]
  std::vector<Layer> layers_;
  std::vector<float> post_w_, post_b_;

  void layer_norm(const float* in, const std::vector<float>& w, const std::vector<float>& b, float* out, size_t M,
                  const kernels::Exec& ex) const;
};

}  // namespace vlm::vision
