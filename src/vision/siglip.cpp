#include "vision/siglip.h"

#include <algorithm>
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

void siglip_tensors(const VisionConfig& v, std::vector<TensorSpec>& e) {
  const int64_t Hv = v.hidden_size, Iv = v.intermediate_size, P = v.patch_size;
  const int64_t patches = P > 0 ? int64_t(v.patches_per_side()) * v.patches_per_side() : 0;
  e.push_back({"vision.embeddings.patch_embedding.weight", {Hv, v.num_channels, P, P}});
  e.push_back({"vision.embeddings.patch_embedding.bias", {Hv}});
  e.push_back({"vision.embeddings.position_embedding.weight", {patches, Hv}});
  e.push_back({"vision.post_layernorm.weight", {Hv}});
  e.push_back({"vision.post_layernorm.bias", {Hv}});
  for (int n = 0; n < v.num_layers; ++n) {
    const std::string p = "vision.encoder.layers." + std::to_string(n) + ".";
    for (const char* ln : {"layer_norm1", "layer_norm2"}) {
      e.push_back({p + ln + ".weight", {Hv}});
      e.push_back({p + ln + ".bias", {Hv}});
    }
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
      e.push_back({p + "self_attn." + proj + ".weight", {Hv, Hv}});
      e.push_back({p + "self_attn." + proj + ".bias", {Hv}});
    }
    e.push_back({p + "mlp.fc1.weight", {Iv, Hv}});
    e.push_back({p + "mlp.fc1.bias", {Iv}});
    e.push_back({p + "mlp.fc2.weight", {Hv, Iv}});
    e.push_back({p + "mlp.fc2.bias", {Hv}});
  }
}

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

  std::vector<TensorSpec> list;
  siglip_tensors(v, list);
  auto get = [&](const std::string& name) -> const TensorView& {
    for (const TensorSpec& t : list)
      if (t.name == name) return ck.get(name, t.shape);
    fail("SigLIP: tensor '{}' is not in its registry", name);
  };
  auto vec = [&](const std::string& name) { return get(name).to_f32(); };
  // f16 matrices whose values are all bf16 values (an f16 mmproj made from a bf16 checkpoint) run on
  // the bf16 GEMMs as bf16 ones do: one pass over their 0.8 GB (4B shapes) here.
  auto weight = [&](const std::string& name) {
    kernels::Weight w = kernels::as_weight(get(name));
    kernels::mark_bf16_exact(w);
    return w;
  };
  const TensorView& pw = get("vision.embeddings.patch_embedding.weight");
  patch_w_ = kernels::Weight{pw.data, pw.dtype, size_t(hidden_), size_t(3 * patch_ * patch_)};
  kernels::mark_bf16_exact(patch_w_);
  patch_b_ = vec("vision.embeddings.patch_embedding.bias");
  pos_ = vec("vision.embeddings.position_embedding.weight");
  for (int i = 0; i < v.num_layers; ++i) {
    const std::string p = "vision.encoder.layers." + std::to_string(i) + ".";
    Layer L;
    L.ln1_w = vec(p + "layer_norm1.weight");
    L.ln1_b = vec(p + "layer_norm1.bias");
    L.ln2_w = vec(p + "layer_norm2.weight");
    L.ln2_b = vec(p + "layer_norm2.bias");
    L.q = weight(p + "self_attn.q_proj.weight");
    L.k = weight(p + "self_attn.k_proj.weight");
    L.v = weight(p + "self_attn.v_proj.weight");
    L.o = weight(p + "self_attn.out_proj.weight");
    L.q_b = vec(p + "self_attn.q_proj.bias");
    L.k_b = vec(p + "self_attn.k_proj.bias");
    L.v_b = vec(p + "self_attn.v_proj.bias");
    L.o_b = vec(p + "self_attn.out_proj.bias");
    L.fc1 = weight(p + "mlp.fc1.weight");
    L.fc1_b = vec(p + "mlp.fc1.bias");
    L.fc2 = weight(p + "mlp.fc2.weight");
    L.fc2_b = vec(p + "mlp.fc2.bias");
    layers_.push_back(std::move(L));
  }
  post_w_ = vec("vision.post_layernorm.weight");
  post_b_ = vec("vision.post_layernorm.bias");
}

double SiglipTower::flops(int n) const {
  const double P = num_patches(), D = hidden_, F = inter_, K = 3.0 * patch_ * patch_;
  const double per_layer = 2 * P * D * D * 4 + 2 * P * D * F * 2 + 2 * P * P * D * 2;
  return n * (2 * P * K * D + per_layer * double(layers_.size()));
}

std::vector<float> SiglipTower::forward(const float* pixels, int n, const kernels::Exec& ex) const {
  Pass pass = begin(pixels, n, ex);
  advance(pass, layers_.size(), ex);
  return finish(std::move(pass), ex);
}

SiglipTower::Pass SiglipTower::begin(const float* pixels, int n, const kernels::Exec& ex) const {
  ThreadPool& pool = ex.threads();
  const size_t S = size_t(image_size_), p = size_t(patch_), g = S / p, P = g * g;
  const size_t D = size_t(hidden_);
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
  Pass pass;
  pass.n = n;
  pass.x.resize(M * D);
  for (auto* a : {&pass.h, &pass.q, &pass.k, &pass.v, &pass.att}) a->resize(M * D);
  pass.f.resize(M * size_t(inter_));
  std::vector<float>& x = pass.x;
  kernels::matmul_bias(patches.data(), M, patch_w_, patch_b_.data(), x.data(), ex);
  patches = {};
  rows_parallel(pool, M, [&](size_t m) {
    const float* pe = &pos_[(m % P) * D];
    for (size_t i = 0; i < D; ++i) x[m * D + i] += pe[i];
  });
  return pass;
}

void SiglipTower::layer_norm(const float* in, const std::vector<float>& w, const std::vector<float>& b, float* out,
                             size_t M, const kernels::Exec& ex) const {
  const size_t D = size_t(hidden_);
  ex.threads().parallel_for(M, [&](size_t lo, size_t hi) {
    kernels::layer_norm(in + lo * D, w.data(), b.data(), out + lo * D, hi - lo, D, eps_, ex.isa);
  });
}

size_t SiglipTower::advance(Pass& pass, size_t layers, const kernels::Exec& ex) const {
  const size_t first = pass.next, end = std::min(layers_.size(), first + layers);
  if (end == first) return 0;
  ThreadPool& pool = ex.threads();
  const size_t P = size_t(num_patches()), D = size_t(hidden_), F = size_t(inter_), H = size_t(heads_), hd = D / H;
  const size_t n = size_t(pass.n), M = n * P;
  float* x = pass.x.data();
  auto &h = pass.h, &q = pass.q, &k = pass.k, &v = pass.v, &att = pass.att, &f = pass.f;
  const float scale = float(1.0 / std::sqrt(double(hd)));
  const nn::AttnShape shape{H, H, hd, 1.f};  // q carries the scale already
  for (; pass.next < end; ++pass.next) {
    const Layer& L = layers_[pass.next];
    layer_norm(x, L.ln1_w, L.ln1_b, h.data(), M, ex);
    kernels::matmul_bias(h.data(), M, L.q, L.q_b.data(), q.data(), ex);
    // q·kᵀ·scale computed as (q·scale)·kᵀ: one pass over [M, D] instead of over every
    // [P, P] score matrix (in f32 the two orders differ by about an ulp).
    rows_parallel(pool, M, [&](size_t m) {
      for (size_t i = 0; i < D; ++i) q[m * D + i] *= scale;
    });
    kernels::matmul_bias(h.data(), M, L.k, L.k_b.data(), k.data(), ex);
    kernels::matmul_bias(h.data(), M, L.v, L.v_b.data(), v.data(), ex);
    // Every patch attends to every patch of its own image (no mask).
    for (size_t img = 0; img < n; ++img)
      nn::attention(&q[img * P * D], P, &k[img * P * D], &v[img * P * D], P, nullptr, shape, &att[img * P * D],
                    pass.work, ex);
    kernels::matmul_bias(att.data(), M, L.o, L.o_b.data(), h.data(), ex);
    rows_parallel(pool, M, [&](size_t m) {
      for (size_t i = 0; i < D; ++i) x[m * D + i] += h[m * D + i];
    });
    layer_norm(x, L.ln2_w, L.ln2_b, h.data(), M, ex);
    kernels::matmul_bias(h.data(), M, L.fc1, L.fc1_b.data(), f.data(), ex);
    pool.parallel_for(M, [&](size_t lo, size_t hi) { kernels::gelu_tanh(&f[lo * F], (hi - lo) * F, ex.isa); });
    kernels::matmul_bias(f.data(), M, L.fc2, L.fc2_b.data(), h.data(), ex);
    rows_parallel(pool, M, [&](size_t m) {
      for (size_t i = 0; i < D; ++i) x[m * D + i] += h[m * D + i];
    });
  }
  return end - first;
}

std::vector<float> SiglipTower::finish(Pass&& pass, const kernels::Exec& ex) const {
  if (!done(pass)) fail("SigLIP: finish() after {} of {} encoder layers", pass.next, layers_.size());
  layer_norm(pass.x.data(), post_w_, post_b_, pass.x.data(), size_t(pass.n) * size_t(num_patches()), ex);
  return std::move(pass.x);
}

}  // namespace vlm::vision
