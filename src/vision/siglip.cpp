#include "vision/siglip.h"

#include <cmath>
#include <string>

#include "core/error.h"
#include "kernels/ops.h"

namespace vlm::vision {

namespace {

// Splits rows [0, n) over the pool.
template <typename F>
void rows_parallel(ThreadPool& pool, size_t n, F&& f) {
  pool.parallel_for(n, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) f(i);
  });
}

}  // namespace

SiglipTower::SiglipTower(const Checkpoint& ck) {
  const ModelConfig& mc = ck.config();
  if (!mc.vision) fail("{}: config.json has no vision_config (not a Gemma 3 VLM)", ck.dir().string());
  const VisionConfig& v = *mc.vision;
  auto need = [](bool ok, const char* field, const std::string& why) {
    if (!ok) fail("config.json: vision_config.{} {}", field, why);
  };
  need(v.hidden_size > 0, "hidden_size", "must be positive");
  need(v.num_heads > 0, "num_attention_heads", "must be positive");
  need(v.hidden_size % std::max(v.num_heads, 1) == 0, "num_attention_heads",
       fmt::format("({}) must divide hidden_size ({})", v.num_heads, v.hidden_size));
  need(v.intermediate_size > 0, "intermediate_size", "must be positive");
  need(v.num_layers > 0, "num_hidden_layers", "must be positive");
  need(v.patch_size > 0, "patch_size", "must be positive");
  need(v.image_size > 0 && v.image_size % std::max(v.patch_size, 1) == 0, "image_size",
       fmt::format("({}) must be a positive multiple of patch_size ({})", v.image_size, v.patch_size));
  need(v.num_channels == 3, "num_channels", fmt::format("is {}, but images are RGB (3)", v.num_channels));
  need(v.layer_norm_eps > 0 && std::isfinite(v.layer_norm_eps), "layer_norm_eps", "must be a positive number");
  need(v.hidden_act == "gelu_pytorch_tanh", "hidden_act",
       fmt::format("'{}' is not supported (gelu_pytorch_tanh expected)", v.hidden_act));
  image_size_ = v.image_size;
  patch_ = v.patch_size;
  hidden_ = v.hidden_size;
  inter_ = v.intermediate_size;
  heads_ = v.num_heads;
  eps_ = float(v.layer_norm_eps);

  const int64_t D = hidden_, F = inter_, P = num_patches();
  const TensorView& pw = ck.get("vision.embeddings.patch_embedding.weight", {D, 3, patch_, patch_});
  patch_w_ = kernels::Weight{pw.data, pw.dtype, size_t(D), size_t(3 * patch_ * patch_)};
  patch_b_ = ck.get("vision.embeddings.patch_embedding.bias", {D}).to_f32();
  pos_ = ck.get("vision.embeddings.position_embedding.weight", {P, D}).to_f32();
  for (int i = 0; i < v.num_layers; ++i) {
    const std::string p = "vision.encoder.layers." + std::to_string(i) + ".";
    Layer L;
    L.ln1_w = ck.get(p + "layer_norm1.weight", {D}).to_f32();
    L.ln1_b = ck.get(p + "layer_norm1.bias", {D}).to_f32();
    L.ln2_w = ck.get(p + "layer_norm2.weight", {D}).to_f32();
    L.ln2_b = ck.get(p + "layer_norm2.bias", {D}).to_f32();
    L.q = kernels::as_weight(ck.get(p + "self_attn.q_proj.weight", {D, D}));
    L.k = kernels::as_weight(ck.get(p + "self_attn.k_proj.weight", {D, D}));
    L.v = kernels::as_weight(ck.get(p + "self_attn.v_proj.weight", {D, D}));
    L.o = kernels::as_weight(ck.get(p + "self_attn.out_proj.weight", {D, D}));
    L.q_b = ck.get(p + "self_attn.q_proj.bias", {D}).to_f32();
    L.k_b = ck.get(p + "self_attn.k_proj.bias", {D}).to_f32();
    L.v_b = ck.get(p + "self_attn.v_proj.bias", {D}).to_f32();
    L.o_b = ck.get(p + "self_attn.out_proj.bias", {D}).to_f32();
    L.fc1 = kernels::as_weight(ck.get(p + "mlp.fc1.weight", {F, D}));
    L.fc1_b = ck.get(p + "mlp.fc1.bias", {F}).to_f32();
    L.fc2 = kernels::as_weight(ck.get(p + "mlp.fc2.weight", {D, F}));
    L.fc2_b = ck.get(p + "mlp.fc2.bias", {D}).to_f32();
    layers_.push_back(std::move(L));
  }
  post_w_ = ck.get("vision.post_layernorm.weight", {D}).to_f32();
  post_b_ = ck.get("vision.post_layernorm.bias", {D}).to_f32();
}

double SiglipTower::flops(int n) const {
  const double P = num_patches(), D = hidden_, F = inter_, K = 3.0 * patch_ * patch_;
  const double per_layer = 2 * P * D * D * 4 + 2 * P * D * F * 2 + 2 * P * P * D * 2;
  return n * (2 * P * K * D + per_layer * double(layers_.size()));
}

std::vector<float> SiglipTower::forward(const float* pixels, int n, ThreadPool& pool) const {
  const size_t S = size_t(image_size_), p = size_t(patch_), g = S / p, P = g * g;
  const size_t D = size_t(hidden_), F = size_t(inter_), H = size_t(heads_), hd = D / H;
  const size_t M = size_t(n) * P, K = 3 * p * p;

  // Unfold each patch in (channel, row, col) order, matching the flattened OIHW kernel.
  std::vector<float> patches(M * K);
  const DType wt = patch_w_.dtype;
  rows_parallel(pool, M, [&](size_t m) {
    const size_t img = m / P, pr = (m % P) / g, pc = m % g;
    float* dst = &patches[m * K];
    for (size_t c = 0; c < 3; ++c)
      for (size_t y = 0; y < p; ++y) {
        const float* src = pixels + ((img * 3 + c) * S + pr * p + y) * S + pc * p;
        for (size_t x = 0; x < p; ++x) {
          const float v = src[x];
          *dst++ = wt == DType::BF16 ? round_bf16(v) : wt == DType::F16 ? f16_to_f32(f32_to_f16(v)) : v;
        }
      }
  });
  std::vector<float> x(M * D);
  kernels::matmul_bias(patches.data(), M, patch_w_, patch_b_.data(), x.data(), pool);
  patches = {};
  rows_parallel(pool, M, [&](size_t m) {
    const float* pe = &pos_[(m % P) * D];
    for (size_t i = 0; i < D; ++i) x[m * D + i] += pe[i];
  });

  std::vector<float> h(M * D), q(M * D), k(M * D), v(M * D), att(M * D), f(M * F);
  std::vector<float> scores(P * P);
  const float scale = float(1.0 / std::sqrt(double(hd)));
  auto layer_norm = [&](const float* in, const std::vector<float>& w, const std::vector<float>& b,
                        float* out) {
    pool.parallel_for(M, [&](size_t lo, size_t hi) {
      kernels::layer_norm(in + lo * D, w.data(), b.data(), out + lo * D, hi - lo, D, eps_);
    });
  };
  for (const Layer& L : layers_) {
    layer_norm(x.data(), L.ln1_w, L.ln1_b, h.data());
    kernels::matmul_bias(h.data(), M, L.q, L.q_b.data(), q.data(), pool);
    // q·kᵀ·scale computed as (q·scale)·kᵀ: one pass over [M, D] instead of over every
    // [P, P] score matrix (in f32 the two orders differ by about an ulp).
    rows_parallel(pool, M, [&](size_t m) {
      for (size_t i = 0; i < D; ++i) q[m * D + i] *= scale;
    });
    kernels::matmul_bias(h.data(), M, L.k, L.k_b.data(), k.data(), pool);
    kernels::matmul_bias(h.data(), M, L.v, L.v_b.data(), v.data(), pool);
    // Every patch attends to every patch of its own image (no mask).
    for (size_t img = 0; img < size_t(n); ++img)
      for (size_t hh = 0; hh < H; ++hh) {
        const size_t off = img * P * D + hh * hd;
        const kernels::Weight kw = kernels::f32_weight(&k[off], P, hd, D);
        kernels::matmul_strided(&q[off], D, P, kw, kernels::Layout::NK, nullptr, scores.data(), P, pool);
        rows_parallel(pool, P, [&](size_t r) { kernels::softmax(&scores[r * P], P); });
        const kernels::Weight vw = kernels::f32_weight(&v[off], P, hd, D);
        kernels::matmul_strided(scores.data(), P, P, vw, kernels::Layout::KN, nullptr, &att[off], D, pool);
      }
    kernels::matmul_bias(att.data(), M, L.o, L.o_b.data(), h.data(), pool);
    rows_parallel(pool, M, [&](size_t m) {
      for (size_t i = 0; i < D; ++i) x[m * D + i] += h[m * D + i];
    });
    layer_norm(x.data(), L.ln2_w, L.ln2_b, h.data());
    kernels::matmul_bias(h.data(), M, L.fc1, L.fc1_b.data(), f.data(), pool);
    pool.parallel_for(M, [&](size_t lo, size_t hi) { kernels::gelu_tanh(&f[lo * F], (hi - lo) * F); });
    kernels::matmul_bias(f.data(), M, L.fc2, L.fc2_b.data(), h.data(), pool);
    rows_parallel(pool, M, [&](size_t m) {
      for (size_t i = 0; i < D; ++i) x[m * D + i] += h[m * D + i];
    });
  }
  layer_norm(x.data(), post_w_, post_b_, x.data());
  return x;
}

}  // namespace vlm::vision
