#include "models/gemma3/decoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"
#include "kernels/format.h"
#include "kernels/ops.h"
#include "models/gemma3/registry.h"

namespace vlm::models::gemma3 {

namespace {

constexpr uint32_t kNoRow = UINT32_MAX;

}  // namespace

Activations::Activations(const TextConfig& c, size_t rows, size_t max_keys) : max_rows(rows) {
  const size_t H = size_t(c.hidden_size), I = size_t(c.intermediate_size), d = size_t(c.head_dim);
  const size_t qrow = size_t(c.num_heads) * d, krow = size_t(c.num_kv_heads) * d;
  x.resize(rows * H);
  normed.resize(rows * H);
  q.resize(rows * qrow);
  k.resize(rows * krow);
  v.resize(rows * krow);
  attn.resize(rows * qrow);
  proj.resize(rows * H);
  gate.resize(rows * I);
  up.resize(rows * I);
  for (int i = 0; i < 2; ++i) {
    rope_cos[i].resize(rows * d / 2);
    rope_sin[i].resize(rows * d / 2);
  }
  ctx_k.resize((size_t(std::max(c.sliding_window, 0)) + rows) * krow);
  ctx_v.resize(ctx_k.size());
  head_in.resize(rows * H);
  runs.reserve(2 * rows);
  decode_rows.reserve(rows);
  embeds.resize(rows * H);
  ids.resize(rows);
  pos.resize(rows);
  seq.resize(rows);
  want.resize(rows);
  slots.reserve(rows);
  nn::reserve_decode(attn_work, {size_t(c.num_heads), size_t(c.num_kv_heads), d, 0.f}, rows, max_keys);
}

Decoder::Decoder(const Checkpoint& ckpt, const kernels::Exec& ex, EmbedScaling scaling)
    : cfg_(ckpt.config().text),
      ex_(ex),
      embedder_(ckpt.get("text.embed_tokens.weight"), scaling) {
  const TextConfig& c = cfg_;
  const int64_t H = c.hidden_size, d = c.head_dim;
  const int64_t nH = c.num_heads, nKV = c.num_kv_heads;
  if (nKV <= 0 || nH % nKV != 0)
    fail("config: num_attention_heads {} is not a multiple of num_key_value_heads {}", nH, nKV);
  if (d % 2) fail("config: head_dim {} must be even for RoPE", d);
  if (embedder_.hidden() != H)
    fail("text.embed_tokens.weight: width {} does not match hidden_size {}", embedder_.hidden(), H);
  for (int l = 0; l < c.num_layers; ++l) {
    auto w = [&](LayerTensor t) { return kernels::as_weight(layer_tensor(ckpt, l, t)); };
    auto vec = [&](LayerTensor t) { return layer_tensor(ckpt, l, t).to_f32(); };
    Layer L;
    L.q = w(LayerTensor::Q);
    L.k = w(LayerTensor::K);
    L.v = w(LayerTensor::V);
    L.o = w(LayerTensor::O);
    L.gate = w(LayerTensor::Gate);
    L.up = w(LayerTensor::Up);
    L.down = w(LayerTensor::Down);
    L.input_norm = vec(LayerTensor::InputNorm);
    L.post_attn_norm = vec(LayerTensor::PostAttnNorm);
    L.pre_ff_norm = vec(LayerTensor::PreFfNorm);
    L.post_ff_norm = vec(LayerTensor::PostFfNorm);
    L.q_norm = vec(LayerTensor::QNorm);
    L.k_norm = vec(LayerTensor::KNorm);
    L.sliding = c.layer_kinds.at(size_t(l)) == LayerKind::Sliding;
    layers_.push_back(std::move(L));
  }
  final_norm_ = registry_tensor(ckpt, "text.norm.weight").to_f32();
  const TensorView& head = ckpt.lm_head();
  if (head.shape.size() != 2 || head.dim(1) != H)
    fail("{}: output head must be [V, {}]", head.name, H);
  head_ = kernels::as_weight(head);
  attn_ = {size_t(nH), size_t(nKV), size_t(d), float(1.0 / std::sqrt(c.query_pre_attn_scalar))};
  eps_ = float(c.rms_norm_eps);
  // Sliding layers use the local base and are never scaled (transformers Gemma3RotaryEmbedding
  // with rope_local_base_freq, rope_scaling applying to global layers only).
  for (std::vector<float>& f : inv_freq_) f.resize(size_t(d / 2));
  kernels::rope_inv_freq(size_t(d), float(c.rope_local_base_freq), 1.f, inv_freq_[0].data());
  kernels::rope_inv_freq(size_t(d), float(c.rope_theta), float(c.rope_scaling_factor), inv_freq_[1].data());
}

void Decoder::forward(const Batch& b, std::span<const SeqSlot> slots, Activations& act, float* logits,
                      const Observer* obs) const {
  const size_t n = b.n, H = size_t(cfg_.hidden_size), half = attn_.head_dim / 2;
  if (n == 0) return;
  if (n > act.max_rows) fail("forward: {} rows exceed the activations' room for {}", n, act.max_rows);
  if (!b.embeds || !b.pos || !b.seq || !b.want_logits) fail("forward: the batch lacks embeds, pos, seq or want_logits");
  const size_t valid = b.valid_rows < 0 ? n : size_t(b.valid_rows);
  if (valid > n) fail("forward: {} valid rows in a batch of {}", valid, n);

  // Each sequence's rows form one run [first, end) of the batch.
  act.runs.assign(2 * slots.size(), kNoRow);
  for (size_t i = 0; i < n; ++i) {
    const int32_t s = b.seq[i];
    if (s < 0 || size_t(s) >= slots.size()) fail("forward: row {} names sequence {} of {}", i, s, slots.size());
    uint32_t* run = &act.runs[2 * size_t(s)];
    if (run[0] == kNoRow) run[0] = uint32_t(i), run[1] = uint32_t(i);
    if (run[1] != i) fail("forward: the rows of sequence {} are not contiguous (row {})", s, i);
    run[1] = uint32_t(i + 1);
  }
  for (size_t s = 0; s < slots.size(); ++s) {
    const uint32_t r0 = act.runs[2 * s], r1 = act.runs[2 * s + 1];
    if (r0 == kNoRow) continue;
    const SeqSlot& slot = slots[s];
    if (!slot.cache) fail("forward: sequence {} has no KV cache", s);
    for (size_t t = 0; t < s; ++t)
      if (slots[t].cache == slot.cache && act.runs[2 * t] != kNoRow)
        fail("forward: sequences {} and {} share one KV cache", t, s);
    if (slot.cache->dtype() != kv_dtype())
      fail("forward: sequence {} has a KV cache of {} rows, this decoder's precision keeps {}", s,
           dtype_name(slot.cache->dtype()), dtype_name(kv_dtype()));
    const int64_t P = slot.cache->length();
    for (uint32_t i = r0; i < r1; ++i)
      if (b.pos[i] != P + int64_t(i - r0))
        fail("forward: row {} of sequence {} has position {}, expected {}", i, s, b.pos[i], P + int64_t(i - r0));
    if (r0 >= valid) fail("forward: sequence {} has only padding rows", s);
    if (!slot.mask) {
      if (P == 0) fail("decode: the sequence has no prefill");
      if (cfg_.sliding_window > 0 && r1 - r0 > uint32_t(cfg_.sliding_window))
        fail("forward: decode sequence {} (no mask) has {} rows, more than the sliding window of {}", s, r1 - r0,
             cfg_.sliding_window);
    } else {
      check_mask_spec(*slot.mask, P, int(r1 - r0));
    }
  }
  // Room in every cache before anything is written (a prompt past the context fails here).
  for (size_t s = 0; s < slots.size(); ++s) {
    const uint32_t r0 = act.runs[2 * s];
    if (r0 != kNoRow) slots[s].cache->reserve(int64_t(std::min<size_t>(act.runs[2 * s + 1], valid) - r0));
  }

  std::memcpy(act.x.data(), b.embeds, n * H * sizeof(float));
  // RoPE angles once per row for the pass, for both frequency sets.
  for (int f = 0; f < 2; ++f)
    for (size_t i = 0; i < n; ++i)
      kernels::rope_cos_sin(b.pos[i], inv_freq_[f].data(), half, act.rope_cos[f].data() + i * half,
                            act.rope_sin[f].data() + i * half);
  for (size_t l = 0; l < layers_.size(); ++l) layer(int(l), b, slots, act, obs);

  size_t nw = 0;
  for (size_t i = 0; i < n; ++i)
    if (b.want_logits[i])
      kernels::rms_norm(act.x.data() + i * H, final_norm_.data(), act.head_in.data() + nw++ * H, 1, H, eps_, ex_.isa);
  if (nw) kernels::matmul(act.head_in.data(), nw, head_, logits, ex_);

  for (size_t s = 0; s < slots.size(); ++s) {
    const uint32_t r0 = act.runs[2 * s];
    if (r0 != kNoRow) slots[s].cache->advance(int64_t(std::min<size_t>(act.runs[2 * s + 1], valid) - r0));
  }
}

void Decoder::layer(int l, const Batch& b, std::span<const SeqSlot> slots, Activations& act,
                    const Observer* obs) const {
  const Layer& L = layers_[size_t(l)];
  const size_t n = b.n, H = size_t(cfg_.hidden_size), I = size_t(cfg_.intermediate_size);
  const size_t d = attn_.head_dim, nH = attn_.n_heads, nKV = attn_.n_kv_heads;
  auto observe = [&](std::string_view name, const float* data, size_t cols) {
    if (obs) (*obs)(name, l, data, n, cols);
  };
  float* x = act.x.data();
  float* a = act.normed.data();
  float* t = act.proj.data();
  // The row-wise work (norms, RoPE, the GELU product, residual adds) over the pool in ranges of
  // rows: on one thread it took about 5 ms of a 512-row prefill's layer, against 94 ms for the
  // whole layer at 16 threads (docs/performance.md, "Threads: 4 to 16"). A decode step's few
  // rows stay on this thread.
  auto rows = [&](auto&& f) {
    ex_.threads().parallel_for(n, [&](size_t r0, size_t r1) { f(r0, r1 - r0); }, kRowGrain);
  };
  // a ← norm(x), row by row.
  auto norm_x = [&](const std::vector<float>& w) {
    rows([&](size_t r, size_t m) { kernels::rms_norm(x + r * H, w.data(), a + r * H, m, H, eps_, ex_.isa); });
  };
  // t ← norm(t); x += t, row by row.
  auto norm_add = [&](const std::vector<float>& w) {
    rows([&](size_t r, size_t m) {
      kernels::rms_norm(t + r * H, w.data(), t + r * H, m, H, eps_, ex_.isa);
      for (size_t i = r * H; i < (r + m) * H; ++i) x[i] += t[i];
    });
  };

  // Attention sublayer: x += post_attn_norm(o(attention(rope(norm(q)), rope(norm(k)), v))).
  norm_x(L.input_norm);
  observe("attn_norm", a, H);
  const kernels::Product qkv[] = {{L.q, act.q.data()}, {L.k, act.k.data()}, {L.v, act.v.data()}};
  kernels::matmul_each(a, n, qkv, ex_);
  const int f = L.sliding ? 0 : 1;
  rows([&](size_t r0, size_t m) {
    float *q = act.q.data() + r0 * nH * d, *k = act.k.data() + r0 * nKV * d;
    kernels::rms_norm(q, L.q_norm.data(), q, m * nH, d, eps_, ex_.isa);
    kernels::rms_norm(k, L.k_norm.data(), k, m * nKV, d, eps_, ex_.isa);
    for (size_t r = r0; r < r0 + m; ++r) {
      const float* cs = act.rope_cos[f].data() + r * (d / 2);
      const float* sn = act.rope_sin[f].data() + r * (d / 2);
      kernels::rope_rotate_half(act.q.data() + r * nH * d, nH, d, cs, sn);
      kernels::rope_rotate_half(act.k.data() + r * nKV * d, nKV, d, cs, sn);
    }
    if (kv_dtype() == DType::BF16) {  // what the cache will hold, for this pass's attention too
      kernels::round_to_bf16(k, k, m * nKV * d, ex_.isa);
      float* v = act.v.data() + r0 * nKV * d;
      kernels::round_to_bf16(v, v, m * nKV * d, ex_.isa);
    }
  });
  act.decode_rows.clear();
  for (size_t s = 0; s < slots.size(); ++s)
    if (act.runs[2 * s] != kNoRow) attend(l, b, slots[s], act.runs[2 * s], act.runs[2 * s + 1], act);
  if (!act.decode_rows.empty()) nn::attention_decode(act.decode_rows, attn_, kv_dtype(), act.attn_work, ex_);
  kernels::matmul(act.attn.data(), n, L.o, t, ex_);
  observe("attn_out", t, H);
  norm_add(L.post_attn_norm);
  observe("attn_post_norm", t, H);
  observe("ffn_inp", x, H);

  // MLP sublayer: x += post_ff_norm(down(gelu_tanh(gate(norm(x))) · up(norm(x)))).
  norm_x(L.pre_ff_norm);
  const kernels::Product gate_up[] = {{L.gate, act.gate.data()}, {L.up, act.up.data()}};
  kernels::matmul_each(a, n, gate_up, ex_);
  rows([&](size_t r, size_t m) {
    kernels::gelu_tanh_mul(act.gate.data() + r * I, act.up.data() + r * I, m * I, ex_.isa);
  });
  kernels::matmul(act.gate.data(), n, L.down, t, ex_);
  norm_add(L.post_ff_norm);
  observe("ffn_out", t, H);
  observe("l_out", x, H);
}

void Decoder::attend(int l, const Batch& b, const SeqSlot& slot, size_t r0, size_t r1, Activations& act) const {
  const Layer& L = layers_[size_t(l)];
  KvCache& c = *slot.cache;
  const size_t qrow = attn_.n_heads * attn_.head_dim, krow = c.row_size();
  const int64_t P = c.length();
  const size_t rows = r1 - r0;
  const size_t valid = std::min(r1, b.valid_rows < 0 ? b.n : size_t(b.valid_rows)) - r0;
  const float* q = act.q.data() + r0 * qrow;
  const float* k = act.k.data() + r0 * krow;
  const float* v = act.v.data() + r0 * krow;
  float* out = act.attn.data() + r0 * qrow;
  const bool bf16 = c.dtype() == DType::BF16;
  // Rows of f32 into the cache (and below, back); under bf16 they were rounded in layer(), so
  // both directions are exact.
  auto write = [&](std::byte* kd, std::byte* vd, const float* kr, const float* vr) {
    if (!bf16) {
      std::memcpy(kd, kr, krow * sizeof(float));
      std::memcpy(vd, vr, krow * sizeof(float));
      return;
    }
    kernels::to_bf16(kr, reinterpret_cast<uint16_t*>(kd), krow, ex_.isa);
    kernels::to_bf16(vr, reinterpret_cast<uint16_t*>(vd), krow, ex_.isa);
  };
  auto put = [&](int64_t pos, const float* kr, const float* vr) {
    write(c.key_slot(l, pos), c.value_slot(l, pos), kr, vr);
  };

  if (!slot.mask) {
    // Decode rows (one, or a draft's: docs/gemma3/decoder.md "Drafts"): each sees every visible
    // cached key, the rows before it and itself, read where the cache holds them, and is attended
    // with the step's other decode rows. On a sliding layer a row's slot may hold a key that an
    // earlier row of the run sees, so the earlier rows are attended before the next is written.
    for (size_t i = 0; i < valid; ++i) {
      put(P + int64_t(i), k + i * krow, v + i * krow);
      const nn::DecodeRow row{q + i * qrow, c.keys(l), c.values(l), c.visible(l, P + int64_t(i) + 1), out + i * qrow};
      if (L.sliding && i + 1 < valid) nn::attention_decode({&row, 1}, attn_, kv_dtype(), act.attn_work, ex_);
      else act.decode_rows.push_back(row);
    }
    return;
  }
  if (!L.sliding && !bf16) {
    // Global layers keep every position in slot order: write the new rows, attend in place.
    for (size_t i = 0; i < valid; ++i) put(P + int64_t(i), k + i * krow, v + i * krow);
    const SpecTiles tiles(*slot.mask, false, P, int(valid), 0);
    nn::attention(q, rows, reinterpret_cast<const float*>(c.keys(l)), reinterpret_cast<const float*>(c.values(l)),
                  size_t(P) + valid, &tiles, attn_, out, act.attn_work, ex_.exact());
    return;
  }
  // Otherwise the cached positions any new row can reach, widened to f32 in position order
  // (sliding layers: the last W − 1; global ones under bf16: all), then the new rows; the cache
  // takes the new rows after attention (on a sliding layer a slot they overwrite may still be
  // visible to an earlier row of this chunk).
  const int64_t W = cfg_.sliding_window, m = L.sliding ? std::min<int64_t>(P, W - 1) : P, base = P - m;
  const size_t need = (size_t(m) + valid) * krow;
  if (act.ctx_k.size() < need) act.ctx_k.resize(need), act.ctx_v.resize(need);  // a long global prefill
  float* ck = act.ctx_k.data();
  float* cv = act.ctx_v.data();
  const kernels::Format& rows_format = kernels::format_of(c.dtype());
  for (int64_t p = base; p < P; ++p) {
    rows_format.to_f32(c.key_slot(l, p), ck + size_t(p - base) * krow, krow);
    rows_format.to_f32(c.value_slot(l, p), cv + size_t(p - base) * krow, krow);
  }
  std::memcpy(ck + size_t(m) * krow, k, valid * krow * sizeof(float));
  std::memcpy(cv + size_t(m) * krow, v, valid * krow * sizeof(float));
  const SpecTiles tiles(*slot.mask, L.sliding, P, int(valid), base);
  nn::attention(q, rows, ck, cv, size_t(m) + valid, &tiles, attn_, out, act.attn_work, ex_.exact());
  // A sliding layer's rows past the window never enter its ring; the cache's log may keep them.
  const int64_t passing = L.sliding ? std::max<int64_t>(0, int64_t(valid) - W) : 0;
  for (int64_t i = 0; i < passing; ++i)
    if (std::byte* kd = c.logged_key_slot(l, P + i))
      write(kd, c.logged_value_slot(l, P + i), k + size_t(i) * krow, v + size_t(i) * krow);
  for (int64_t i = passing; i < int64_t(valid); ++i) put(P + i, k + size_t(i) * krow, v + size_t(i) * krow);
}

std::vector<float> Decoder::prefill_from_embeddings(const PrefillInput& in, KvCache& cache,
                                                    const PrefillOptions& opts) const {
  const size_t H = size_t(cfg_.hidden_size), Lp = size_t(in.Lp);
  if (in.Lp <= 0 || in.valid_len <= 0 || in.valid_len > in.Lp)
    fail("prefill: valid length {} must be in [1, Lp = {}]", in.valid_len, in.Lp);
  if (in.embeds.size() != Lp * H)
    fail("prefill: embeddings have {} values, expected {}x{}", in.embeds.size(), Lp, H);
  MaskSpec spec;
  spec.window = cfg_.sliding_window;
  spec.dense_global = &in.mask_global;
  spec.dense_sliding = in.mask_sliding.empty() ? nullptr : &in.mask_sliding;
  Activations act(cfg_, Lp);
  const int64_t P = cache.length();
  for (size_t i = 0; i < Lp; ++i) {
    act.pos[i] = P + int64_t(i);
    act.seq[i] = 0;
    act.want[i] = opts.all_logits || i == size_t(in.valid_len - 1);
  }
  const Batch b{in.embeds.data(), Lp, act.pos.data(), act.seq.data(), act.want.data(), in.valid_len};
  const SeqSlot slot{&cache, &spec};
  std::vector<float> logits((opts.all_logits ? Lp : 1) * head_.rows);
  forward(b, {&slot, 1}, act, logits.data(), opts.observer);
  return logits;
}

void Decoder::decode_step(std::span<const DecodeItem> items, Activations& act, float* logits) const {
  const size_t B = items.size();
  if (B == 0) return;
  if (B > act.max_rows) fail("decode: {} sequences exceed the activations' room for {}", B, act.max_rows);
  act.slots.clear();
  for (size_t i = 0; i < B; ++i) {
    act.ids[i] = items[i].token;
    act.pos[i] = items[i].cache->length();
    act.seq[i] = int32_t(i);
    act.want[i] = 1;
    act.slots.push_back({items[i].cache, nullptr});
  }
  embedder_.embed({act.ids.data(), B}, act.embeds.data());  // validates ids before any cache change
  const Batch b{act.embeds.data(), B, act.pos.data(), act.seq.data(), act.want.data(), -1};
  forward(b, act.slots, act, logits, nullptr);
}

std::vector<float> Decoder::decode_step(std::span<const DecodeItem> items) const {
  Activations act(cfg_, std::max<size_t>(items.size(), 1));
  std::vector<float> logits(items.size() * head_.rows);
  decode_step(items, act, logits.data());
  return logits;
}

}  // namespace vlm::models::gemma3
