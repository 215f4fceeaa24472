#include "models/gemma3.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>
#include <string>

#include <fmt/ranges.h>

#include "core/error.h"
#include "kernels/ops.h"

namespace vlm {

namespace {

void check_mask(const std::vector<float>& m, size_t Lp, const char* what) {
  if (m.size() != Lp * Lp) fail("prefill: {} has {} entries, expected {}x{}", what, m.size(), Lp, Lp);
  for (float v : m)
    if (std::isnan(v) || v == INFINITY) fail("prefill: {} holds NaN or +inf", what);
}

}  // namespace

Gemma3::Gemma3(const Checkpoint& ckpt, ThreadPool& pool, EmbedScaling scaling)
    : cfg_(ckpt.config().text),
      pool_(pool),
      embedder_(ckpt.get("text.embed_tokens.weight"), scaling) {
  const TextConfig& c = cfg_;
  const int64_t H = c.hidden_size, I = c.intermediate_size, d = c.head_dim;
  const int64_t nH = c.num_heads, nKV = c.num_kv_heads;
  if (nKV <= 0 || nH % nKV != 0)
    fail("config: num_attention_heads {} is not a multiple of num_key_value_heads {}", nH, nKV);
  if (d % 2) fail("config: head_dim {} must be even for RoPE", d);
  if (embedder_.hidden() != H)
    fail("text.embed_tokens.weight: width {} does not match hidden_size {}", embedder_.hidden(), H);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "text.layers." + std::to_string(l) + ".";
    Layer L;
    L.q = kernels::as_weight(ckpt.get(p + "self_attn.q_proj.weight", {nH * d, H}));
    L.k = kernels::as_weight(ckpt.get(p + "self_attn.k_proj.weight", {nKV * d, H}));
    L.v = kernels::as_weight(ckpt.get(p + "self_attn.v_proj.weight", {nKV * d, H}));
    L.o = kernels::as_weight(ckpt.get(p + "self_attn.o_proj.weight", {H, nH * d}));
    L.gate = kernels::as_weight(ckpt.get(p + "mlp.gate_proj.weight", {I, H}));
    L.up = kernels::as_weight(ckpt.get(p + "mlp.up_proj.weight", {I, H}));
    L.down = kernels::as_weight(ckpt.get(p + "mlp.down_proj.weight", {H, I}));
    L.input_norm = ckpt.get(p + "input_layernorm.weight", {H}).to_f32();
    L.post_attn_norm = ckpt.get(p + "post_attention_layernorm.weight", {H}).to_f32();
    L.pre_ff_norm = ckpt.get(p + "pre_feedforward_layernorm.weight", {H}).to_f32();
    L.post_ff_norm = ckpt.get(p + "post_feedforward_layernorm.weight", {H}).to_f32();
    L.q_norm = ckpt.get(p + "self_attn.q_norm.weight", {d}).to_f32();
    L.k_norm = ckpt.get(p + "self_attn.k_norm.weight", {d}).to_f32();
    L.sliding = c.layer_kinds.at(size_t(l)) == LayerKind::Sliding;
    layers_.push_back(std::move(L));
  }
  final_norm_ = ckpt.get("text.norm.weight", {H}).to_f32();
  const TensorView& head = ckpt.lm_head();
  if (head.shape.size() != 2 || head.dim(1) != H)
    fail("{}: output head must be [V, {}]", head.name, H);
  head_ = kernels::as_weight(head);
  attn_ = {size_t(nH), size_t(nKV), size_t(d), float(1.0 / std::sqrt(c.query_pre_attn_scalar))};
  eps_ = float(c.rms_norm_eps);
  inv_freq_local_.resize(size_t(d / 2));
  inv_freq_global_.resize(size_t(d / 2));
  // Sliding layers use the local base and are never scaled (spec §1.5, §10.3).
  kernels::rope_inv_freq(size_t(d), float(c.rope_local_base_freq), 1.f, inv_freq_local_.data());
  kernels::rope_inv_freq(size_t(d), float(c.rope_theta), float(c.rope_scaling_factor),
                         inv_freq_global_.data());
}

void Gemma3::project_qkv(const Layer& L, const float* x, size_t n, const int64_t* pos, float* q,
                         float* k, float* v) {
  const size_t H = size_t(cfg_.hidden_size), d = attn_.head_dim;
  const size_t nH = attn_.n_heads, nKV = attn_.n_kv_heads;
  std::vector<float>& a = scratch_.a;
  a.resize(n * H);
  kernels::rms_norm(x, L.input_norm.data(), a.data(), n, H, eps_);
  kernels::matmul(a.data(), n, L.q, q, pool_);
  kernels::matmul(a.data(), n, L.k, k, pool_);
  kernels::matmul(a.data(), n, L.v, v, pool_);
  kernels::rms_norm(q, L.q_norm.data(), q, n * nH, d, eps_);
  kernels::rms_norm(k, L.k_norm.data(), k, n * nKV, d, eps_);
  const std::vector<float>& f = inv_freq(L.sliding);
  std::vector<float>& cs = scratch_.cos;
  std::vector<float>& sn = scratch_.sin;
  cs.resize(d / 2);
  sn.resize(d / 2);
  for (size_t r = 0; r < n; ++r) {
    kernels::rope_cos_sin(pos[r], f.data(), d / 2, cs.data(), sn.data());
    kernels::rope_rotate_half(q + r * nH * d, nH, d, cs.data(), sn.data());
    kernels::rope_rotate_half(k + r * nKV * d, nKV, d, cs.data(), sn.data());
  }
}

void Gemma3::finish_layer(const Layer& L, float* x, const float* attn, size_t n) {
  const size_t H = size_t(cfg_.hidden_size), I = size_t(cfg_.intermediate_size);
  std::vector<float>& t = scratch_.t;
  std::vector<float>& gate = scratch_.gate;
  std::vector<float>& up = scratch_.up;
  t.resize(n * H);
  gate.resize(n * I);
  up.resize(n * I);
  kernels::matmul(attn, n, L.o, t.data(), pool_);
  kernels::rms_norm(t.data(), L.post_attn_norm.data(), t.data(), n, H, eps_);
  for (size_t i = 0; i < n * H; ++i) x[i] += t[i];
  kernels::rms_norm(x, L.pre_ff_norm.data(), t.data(), n, H, eps_);
  kernels::matmul(t.data(), n, L.gate, gate.data(), pool_);
  kernels::matmul(t.data(), n, L.up, up.data(), pool_);
  kernels::gelu_tanh_mul(gate.data(), up.data(), n * I);
  kernels::matmul(gate.data(), n, L.down, t.data(), pool_);
  kernels::rms_norm(t.data(), L.post_ff_norm.data(), t.data(), n, H, eps_);
  for (size_t i = 0; i < n * H; ++i) x[i] += t[i];
}

std::vector<float> Gemma3::head(const float* x, size_t n) {
  const size_t H = size_t(cfg_.hidden_size);
  std::vector<float> h(n * H), logits(n * head_.rows);
  kernels::rms_norm(x, final_norm_.data(), h.data(), n, H, eps_);
  kernels::matmul(h.data(), n, head_, logits.data(), pool_);
  return logits;
}

std::vector<float> Gemma3::prefill_from_embeddings(const PrefillInput& in, KvCache& cache,
                                                   const PrefillOptions& opts) {
  const size_t H = size_t(cfg_.hidden_size), Lp = size_t(in.Lp);
  if (in.Lp <= 0 || in.valid_len <= 0 || in.valid_len > in.Lp)
    fail("prefill: valid length {} must be in [1, Lp = {}]", in.valid_len, in.Lp);
  if (in.embeds.size() != Lp * H)
    fail("prefill: embeddings have {} values, expected {}x{}", in.embeds.size(), Lp, H);
  check_mask(in.mask_global, Lp, "global mask");
  if (!in.mask_sliding.empty()) check_mask(in.mask_sliding, Lp, "sliding mask");
  const int64_t P = cache.length();  // positions already cached (a continuation)
  cache.reserve(in.valid_len);  // fails before compute when the prompt exceeds the context

  const size_t qrow = attn_.n_heads * attn_.head_dim, krow = cache.row_size();
  std::vector<float> x = in.embeds, q(Lp * qrow), k(Lp * krow), v(Lp * krow), o(Lp * qrow);
  std::vector<int64_t> pos(Lp);
  std::iota(pos.begin(), pos.end(), P);
  std::vector<float> keys, values, mask_ext;  // cached + new keys, for a continuation
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    project_qkv(L, x.data(), Lp, pos.data(), q.data(), k.data(), v.data());
    const std::vector<float>& mask =
        L.sliding && !in.mask_sliding.empty() ? in.mask_sliding : in.mask_global;
    if (P == 0) {
      models::attention_prefill(q.data(), Lp, k.data(), v.data(), Lp, mask.data(), attn_, o.data(), pool_);
    } else {
      const size_t nc = continuation_keys(cache, int(l), P, in, mask, k, v, keys, values, mask_ext);
      models::attention_prefill(q.data(), Lp, keys.data(), values.data(), nc + Lp, mask_ext.data(), attn_,
                                o.data(), pool_);
    }
    // Only real positions enter the cache (after attention: a ring slot may still have
    // been visible to this chunk); a ring keeps the last W of them.
    const int64_t first = L.sliding ? std::max<int64_t>(0, in.valid_len - cfg_.sliding_window) : 0;
    for (int64_t i = first; i < in.valid_len; ++i) {
      std::memcpy(cache.key_slot(int(l), P + i), k.data() + size_t(i) * krow, krow * sizeof(float));
      std::memcpy(cache.value_slot(int(l), P + i), v.data() + size_t(i) * krow, krow * sizeof(float));
    }
    finish_layer(L, x.data(), o.data(), Lp);
    if (opts.on_layer) opts.on_layer(int(l), x.data());
  }
  cache.advance(in.valid_len);
  if (opts.all_logits) return head(x.data(), Lp);
  return head(x.data() + size_t(in.valid_len - 1) * H, 1);
}

size_t Gemma3::continuation_keys(const KvCache& cache, int layer, int64_t P, const PrefillInput& in,
                                 const std::vector<float>& mask, const std::vector<float>& k,
                                 const std::vector<float>& v, std::vector<float>& keys,
                                 std::vector<float>& values, std::vector<float>& mask_ext) const {
  const size_t Lp = size_t(in.Lp), krow = cache.row_size();
  const size_t nc = cache.visible(layer, P), W = size_t(cfg_.sliding_window);
  const bool sliding = layers_[size_t(layer)].sliding;
  keys.assign(cache.keys(layer), cache.keys(layer) + nc * krow);
  keys.insert(keys.end(), k.begin(), k.end());
  values.assign(cache.values(layer), cache.values(layer) + nc * krow);
  values.insert(values.end(), v.begin(), v.end());
  // Cached slot s holds position p_s (ring: p ≡ s mod W within the last W positions).
  std::vector<int64_t> slot_pos(nc);
  for (size_t s = 0; s < nc; ++s)
    slot_pos[s] = sliding && size_t(P) > W ? P - int64_t(W) + int64_t((s + W - size_t(P) % W) % W) : int64_t(s);
  const size_t Lk = nc + Lp;
  mask_ext.assign(Lp * Lk, std::numeric_limits<float>::lowest());
  for (size_t i = 0; i < size_t(in.valid_len); ++i) {
    // Every cached key is in this chunk's past: global layers see all of them, sliding
    // layers those with q − k < W (spec §9.2, §11).
    for (size_t s = 0; s < nc; ++s)
      if (!sliding || P + int64_t(i) - slot_pos[s] < int64_t(W)) mask_ext[i * Lk + s] = 0.f;
    std::copy_n(mask.data() + i * Lp, Lp, mask_ext.data() + i * Lk + nc);
  }
  return nc;
}

std::vector<float> Gemma3::decode_step(std::span<const DecodeItem> batch) {
  const size_t B = batch.size();
  if (B == 0) return {};
  std::set<const KvCache*> seen;
  std::vector<int32_t> tokens(B);
  std::vector<int64_t> pos(B);
  for (size_t b = 0; b < B; ++b) {
    if (!seen.insert(batch[b].cache).second) fail("decode: a sequence appears twice in one batch");
    if (batch[b].cache->length() == 0) fail("decode: the sequence has no prefill");
    tokens[b] = batch[b].token;
    pos[b] = batch[b].cache->length();
  }
  std::vector<float> x = embedder_.embed(tokens);  // validates ids before any cache change
  for (size_t b = 0; b < B; ++b) batch[b].cache->reserve(1);

  const size_t qrow = attn_.n_heads * attn_.head_dim, krow = batch[0].cache->row_size();
  std::vector<float> q(B * qrow), k(B * krow), v(B * krow), o(B * qrow);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    project_qkv(L, x.data(), B, pos.data(), q.data(), k.data(), v.data());
    for (size_t b = 0; b < B; ++b) {
      KvCache& c = *batch[b].cache;
      std::memcpy(c.key_slot(int(l), pos[b]), k.data() + b * krow, krow * sizeof(float));
      std::memcpy(c.value_slot(int(l), pos[b]), v.data() + b * krow, krow * sizeof(float));
      models::attention_decode(q.data() + b * qrow, c.keys(int(l)), c.values(int(l)),
                               c.visible(int(l), pos[b] + 1), attn_, o.data() + b * qrow, pool_);
    }
    finish_layer(L, x.data(), o.data(), B);
  }
  for (size_t b = 0; b < B; ++b) batch[b].cache->advance(1);
  return head(x.data(), B);
}

}  // namespace vlm
