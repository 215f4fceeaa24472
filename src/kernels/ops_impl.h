// ISA-generic bodies of the element-wise and row-wise ops (ops.h), written against a
// SIMD traits class S (see simd.h). exp and tanh are evaluated here rather than by
// libm so that they vectorize; both stay within a few ulp of the exact functions.
// sqrt is __builtin_sqrtf: an inline std:: wrapper could be emitted out of line in an
// ISA file and then picked by the linker for baseline code.
#pragma once
#include <cmath>  // INFINITY only: library calls would not be compiled for the ISA
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/simd.h"

namespace vlm::kernels::detail {

struct OpsKernels {
  void (*rms_norm)(const float* x, const float* w, float* y, size_t rows, size_t dim, float eps);
  void (*layer_norm)(const float* x, const float* g, const float* b, float* y, size_t rows,
                     size_t dim, float eps);
  void (*gelu_tanh)(float* x, size_t n);
  void (*gelu_tanh_mul)(float* gate, const float* up, size_t n);
  void (*softmax)(float* x, size_t n);
  void (*scaled_softmax)(float* x, size_t n, float scale, const float* mask, bool round);
  float (*scaled_exp)(float* x, size_t n, float scale, const float* mask);
  void (*exp_normalize)(float* x, size_t n, float mx, bool round);
  void (*attend_chunk)(const float* q, size_t H, size_t G, const float* k, const float* v, size_t stride,
                       size_t n, size_t d, float scale, float* p, float* m, float* l, float* o);
  void (*attend_chunk_bf16)(const float* q, size_t H, size_t G, const uint16_t* k, const uint16_t* v,
                            size_t stride, size_t n, size_t d, float scale, float* p, float* m, float* l, float* o);
  void (*round_to_bf16)(const float* x, float* y, size_t n);
  void (*to_bf16)(const float* x, uint16_t* y, size_t n);
};
extern const OpsKernels kScalarOps;
extern const OpsKernels kAvx2Ops;
extern const OpsKernels kAvx512Ops;

// e^x for x ≤ 88; 0 below ln(FLT_MIN) (no subnormal results). Cody–Waite reduction
// x = n·ln2 + r, |r| ≤ ln2/2, then the Taylor series of e^r to degree 7 (truncation
// below 0.1 ulp) and a scale by 2^n.
template <class S>
inline typename S::V exp_v(typename S::V x) {
  using V = typename S::V;
  const V lo = S::set1(-87.33654f);
  const auto tiny = S::lt(x, lo);
  x = S::min(S::max(x, lo), S::set1(88.f));
  const V n = S::round(S::mul(x, S::set1(1.44269504088896341f)));
  // ln2_hi has 15 significant bits, so n·ln2_hi is exact for |n| ≤ 127.
  V r = S::fma(n, S::set1(-0.693145751953125f), x);
  r = S::fma(n, S::set1(-1.428606765330187e-06f), r);
  V p = S::set1(1.f / 5040);
  p = S::fma(p, r, S::set1(1.f / 720));
  p = S::fma(p, r, S::set1(1.f / 120));
  p = S::fma(p, r, S::set1(1.f / 24));
  p = S::fma(p, r, S::set1(1.f / 6));
  p = S::fma(p, r, S::set1(0.5f));
  p = S::fma(p, r, S::set1(1.f));
  p = S::fma(p, r, S::set1(1.f));
  return S::select(tiny, S::zero(), S::times_pow2(p, n));
}

// tanh(z) = (e^{2|z|} − 1) / (e^{2|z|} + 1) with the sign of z. Below 2|z| = 0.75 the
// numerator cancels, so there e^t − 1 comes from its own Taylor series (degree 10,
// truncation < 1e-9 relative).
template <class S>
inline typename S::V tanh_v(typename S::V z) {
  using V = typename S::V;
  const V a = S::abs(z);
  const V t = S::add(a, a);
  V p = S::set1(1.f / 3628800);
  p = S::fma(p, t, S::set1(1.f / 362880));
  p = S::fma(p, t, S::set1(1.f / 40320));
  p = S::fma(p, t, S::set1(1.f / 5040));
  p = S::fma(p, t, S::set1(1.f / 720));
  p = S::fma(p, t, S::set1(1.f / 120));
  p = S::fma(p, t, S::set1(1.f / 24));
  p = S::fma(p, t, S::set1(1.f / 6));
  p = S::fma(p, t, S::set1(0.5f));
  p = S::fma(p, t, S::set1(1.f));
  const V em1 = S::mul(t, p);
  const V small = S::div(em1, S::add(em1, S::set1(2.f)));
  // e^40 makes the quotient 1 in f32 already; the clamp keeps e finite.
  const V e = exp_v<S>(S::min(t, S::set1(40.f)));
  const V one = S::set1(1.f);
  const V large = S::div(S::sub(e, one), S::add(e, one));
  return S::copysign(S::select(S::lt(t, S::set1(0.75f)), small, large), z);
}

// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), rounded step by step as PyTorch's f32
// gelu_pytorch_tanh does.
template <class S>
inline typename S::V gelu_v(typename S::V x) {
  using V = typename S::V;
  const V x3 = S::mul(S::mul(x, x), x);
  const V inner = S::mul(S::set1(0.7978845608028654f), S::add(x, S::mul(S::set1(0.044715f), x3)));
  return S::mul(S::mul(S::set1(0.5f), x), S::add(S::set1(1.f), tanh_v<S>(inner)));
}

template <class S>
void gelu_k(float* x, size_t n) {
  size_t i = 0;
  for (; i + S::W <= n; i += S::W) S::store(x + i, gelu_v<S>(S::load(x + i)));
  if (i < n) store_part<S>(x + i, gelu_v<S>(load_part<S>(x + i, n - i)), n - i);
}

template <class S>
void gelu_mul_k(float* g, const float* u, size_t n) {
  size_t i = 0;
  for (; i + S::W <= n; i += S::W) S::store(g + i, S::mul(gelu_v<S>(S::load(g + i)), S::load(u + i)));
  if (i < n)
    store_part<S>(g + i, S::mul(gelu_v<S>(load_part<S>(g + i, n - i)), load_part<S>(u + i, n - i)),
                  n - i);
}

// x ← e^(x − m) in place; returns Σ.
template <class S>
float exp_sum(float* x, size_t n, float m) {
  using V = typename S::V;
  const V mv = S::set1(m);
  V vs = S::zero();
  size_t i = 0;
  for (; i + S::W <= n; i += S::W) {
    const V e = exp_v<S>(S::sub(S::load(x + i), mv));
    S::store(x + i, e);
    vs = S::add(vs, e);
  }
  if (i < n) {
    const V e = exp_v<S>(S::sub(load_part<S>(x + i, n - i, -INFINITY), mv));  // padding gives 0
    store_part<S>(x + i, e, n - i);
    vs = S::add(vs, e);
  }
  return S::hsum(vs);
}

// The shift of a row whose largest entry is mx: mx, or 0 for an all −inf row, whose
// (−inf) − (−inf) would be NaN (shifted by 0 it gives zeros). static: no shared copy across
// the ISA files.
static inline float shift_of(float mx) { return mx == -INFINITY ? 0.f : mx; }

// x ← e^(x − max x) in place; returns Σ, *mx the shift (shift_of).
template <class S>
float exp_shifted(float* x, size_t n, float* mx) {
  using V = typename S::V;
  const float ninf = -INFINITY;
  V vm = S::set1(ninf);
  size_t i = 0;
  for (; i + S::W <= n; i += S::W) vm = S::max(vm, S::load(x + i));
  if (i < n) vm = S::max(vm, load_part<S>(x + i, n - i, ninf));
  *mx = shift_of(S::hmax(vm));
  return exp_sum<S>(x, n, *mx);
}

// x ← x / sum (0 for a zero sum), then rounded to bf16 when asked (as round_bf16_k).
template <class S>
void normalize(float* x, size_t n, float sum, bool round) {
  using V = typename S::V;
  const V inv = S::set1(sum > 0.f ? 1.f / sum : 0.f);
  auto scaled = [&](V v) { return round ? S::round_bf16(S::mul(v, inv)) : S::mul(v, inv); };
  size_t i = 0;
  for (; i + S::W <= n; i += S::W) S::store(x + i, scaled(S::load(x + i)));
  if (i < n) store_part<S>(x + i, scaled(load_part<S>(x + i, n - i)), n - i);
}

template <class S>
void softmax_k(float* x, size_t n) {
  if (n == 0) return;
  float mx;
  normalize<S>(x, n, exp_shifted<S>(x, n, &mx), false);
}

// e^(x · scale + mask − max) in place with the scaling and the max in one pass; returns Σ (ops.h,
// scaled_exp).
template <class S>
float scaled_exp_k(float* x, size_t n, float scale, const float* mask) {
  using V = typename S::V;
  if (n == 0) return 0.f;
  const float ninf = -INFINITY;
  const V sv = S::set1(scale);
  V vm = S::set1(ninf);
  size_t i = 0;
  for (; i + S::W <= n; i += S::W) {
    const V t = S::mul(S::load(x + i), sv);
    const V u = mask ? S::add(t, S::load(mask + i)) : t;
    S::store(x + i, u);
    vm = S::max(vm, u);
  }
  if (i < n) {
    const V t = S::mul(load_part<S>(x + i, n - i), sv);
    store_part<S>(x + i, mask ? S::add(t, load_part<S>(mask + i, n - i)) : t, n - i);
    vm = S::max(vm, load_part<S>(x + i, n - i, ninf));
  }
  return exp_sum<S>(x, n, shift_of(S::hmax(vm)));
}

// softmax(x · scale + mask) (ops.h, scaled_softmax).
template <class S>
void scaled_softmax_k(float* x, size_t n, float scale, const float* mask, bool round) {
  if (n > 0) normalize<S>(x, n, scaled_exp_k<S>(x, n, scale, mask), round);
}

// ops.h, exp_normalize.
template <class S>
void exp_normalize_k(float* x, size_t n, float mx, bool round) {
  normalize<S>(x, n, exp_sum<S>(x, n, shift_of(mx)), round);
}

// Σ (v[i] − c) and Σ (v[i] − c)² over one row, in f32 lanes.
template <class S>
void sums(const float* v, size_t n, float c, float& s1, float& s2) {
  using V = typename S::V;
  const V cv = S::set1(c);
  V a0 = S::zero(), a1 = S::zero(), q0 = S::zero(), q1 = S::zero();
  size_t i = 0;
  for (; i + 2 * S::W <= n; i += 2 * S::W) {
    const V d0 = S::sub(S::load(v + i), cv), d1 = S::sub(S::load(v + i + S::W), cv);
    a0 = S::add(a0, d0);
    a1 = S::add(a1, d1);
    q0 = S::fma(d0, d0, q0);
    q1 = S::fma(d1, d1, q1);
  }
  for (; i + S::W <= n; i += S::W) {
    const V d = S::sub(S::load(v + i), cv);
    a0 = S::add(a0, d);
    q0 = S::fma(d, d, q0);
  }
  if (i < n) {
    const V d = S::sub(load_part<S>(v + i, n - i, c), cv);  // padding gives 0
    a0 = S::add(a0, d);
    q0 = S::fma(d, d, q0);
  }
  s1 = S::hsum(S::add(a0, a1));
  s2 = S::hsum(S::add(q0, q1));
}

template <class S>
void rms_norm_k(const float* x, const float* w, float* y, size_t rows, size_t dim, float eps) {
  using V = typename S::V;
  const V one = S::set1(1.f);
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    float s1, s2;
    sums<S>(xr, dim, 0.f, s1, s2);
    const float ms = s2 / float(dim);
    const V inv = S::set1(1.f / __builtin_sqrtf(ms + eps));
    size_t i = 0;
    for (; i + S::W <= dim; i += S::W)
      S::store(yr + i, S::mul(S::mul(S::load(xr + i), inv), S::add(one, S::load(w + i))));
    if (i < dim) {
      const size_t n = dim - i;
      store_part<S>(yr + i, S::mul(S::mul(load_part<S>(xr + i, n), inv), S::add(one, load_part<S>(w + i, n))), n);
    }
  }
}

template <class S>
void layer_norm_k(const float* x, const float* g, const float* b, float* y, size_t rows, size_t dim,
                  float eps) {
  using V = typename S::V;
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    // Two passes with a corrected mean: the deviations' sum removes the rounding of the
    // first mean, so rows with a large mean keep their precision. Biased variance.
    float s0, s1, s2;
    sums<S>(xr, dim, 0.f, s0, s1);
    const float mean0 = s0 / float(dim);
    sums<S>(xr, dim, mean0, s1, s2);
    const float mean = mean0 + s1 / float(dim);
    const float var = (s2 - s1 * s1 / float(dim)) / float(dim);
    const V inv = S::set1(1.f / __builtin_sqrtf(var + eps)), m = S::set1(mean);
    size_t i = 0;
    for (; i + S::W <= dim; i += S::W)
      S::store(yr + i, S::fma(S::mul(S::sub(S::load(xr + i), m), inv), S::load(g + i), S::load(b + i)));
    if (i < dim) {
      const size_t n = dim - i;
      store_part<S>(yr + i,
                    S::fma(S::mul(S::sub(load_part<S>(xr + i, n), m), inv), load_part<S>(g + i, n),
                           load_part<S>(b + i, n)),
                    n);
    }
  }
}

// A KV cache row's values, f32 or bf16 (widened exactly): W of them, or the first w then zeros.
template <class S>
inline typename S::V load_kv(const float* p) { return S::load(p); }
template <class S>
inline typename S::V load_kv(const uint16_t* p) { return S::load_bf16(p); }
template <class S>
inline typename S::V load_kv_part(const float* p, size_t w) { return load_part<S>(p, w); }
template <class S>
inline typename S::V load_kv_part(const uint16_t* p, size_t w) {
  uint16_t tmp[S::W] = {};
  for (size_t i = 0; i < w; ++i) tmp[i] = p[i];
  return S::load_bf16(tmp);
}
// (On S too, so that each ISA file's copy is its own symbol: see the top of this file.)
template <class S>
inline float kv_value(float x) { return x; }
template <class S>
inline float kv_value(uint16_t x) {
  const uint32_t u = uint32_t(x) << 16;
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}

// p[g·pn + t·step] = q_g·k_t · scale for NG query heads (rows d apart) and NT key rows
// (`step` positions of `stride` values apart): each load serves NG or NT products, and NG·NT
// sums are in flight.
template <class S, int NG, int NT, class T>
inline void chunk_dots(const float* q, const T* k, size_t stride, size_t step, size_t d, float scale, float* p,
                       size_t pn) {
  using V = typename S::V;
  V a[NT][NG];
  VLM_UNROLL for (int t = 0; t < NT; ++t) VLM_UNROLL for (int g = 0; g < NG; ++g) a[t][g] = S::zero();
  for (size_t i = 0; i < d; i += S::W) {
    const size_t w = d - i < size_t(S::W) ? d - i : 0;  // a partial last vector
    V x[NT];
    VLM_UNROLL for (int t = 0; t < NT; ++t)
      x[t] = w ? load_kv_part<S>(k + t * step * stride + i, w) : load_kv<S>(k + t * step * stride + i);
    VLM_UNROLL for (int g = 0; g < NG; ++g) {
      const V qg = w ? load_part<S>(q + g * d + i, w) : S::load(q + g * d + i);
      VLM_UNROLL for (int t = 0; t < NT; ++t) a[t][g] = S::fma(qg, x[t], a[t][g]);
    }
  }
  VLM_UNROLL for (int t = 0; t < NT; ++t) VLM_UNROLL for (int g = 0; g < NG; ++g)
    p[g * pn + t * step] = S::hsum(a[t][g]) * scale;
}

// o[g, :] += Σ_t p[g·pn + t·step]·v[t·step, :] over the NT keys at v for NG heads (rows of o d
// apart; first: o starts at zero). Each value load serves NG heads; the sums go back to o, in
// L1, so the value rows are read from start to end. (Sums held in registers over all of a
// chunk's keys meant walking a column strip down rows 4 KiB apart: every load in one or two L1
// sets.)
template <class S, int NG, int NT, class T>
void values_block(const float* p, size_t pn, const T* v, size_t stride, size_t step, float* o, size_t d,
                  bool first) {
  using V = typename S::V;
  V e[NG][NT];
  VLM_UNROLL for (int g = 0; g < NG; ++g) VLM_UNROLL for (int t = 0; t < NT; ++t)
    e[g][t] = S::set1(p[g * pn + t * step]);
  size_t c = 0;
  for (; c + S::W <= d; c += S::W) {
    V x[NT];
    VLM_UNROLL for (int t = 0; t < NT; ++t) x[t] = load_kv<S>(v + t * step * stride + c);
    VLM_UNROLL for (int g = 0; g < NG; ++g) {
      V acc = first ? S::zero() : S::load(o + g * d + c);
      VLM_UNROLL for (int t = 0; t < NT; ++t) acc = S::fma(e[g][t], x[t], acc);
      S::store(o + g * d + c, acc);
    }
  }
  for (; c < d; ++c)
    for (int g = 0; g < NG; ++g) {
      float sum = first ? 0.f : o[g * d + c];
      for (int t = 0; t < NT; ++t) sum += p[g * pn + t * step] * kv_value<S>(v[t * step * stride + c]);
      o[g * d + c] = sum;
    }
}

template <class S, class T>
void attend_chunk_k(const float* q, size_t H, size_t G, const T* k, const T* v, size_t stride, size_t n,
                    size_t d, float scale, float* p, float* m, float* l, float* o) {
  // fn(std::integral_constant<int, NG>(), h) for the query heads h .. h + NG (NG = 2 where two
  // share a KV head), so each key or value load serves both.
  auto pairs = [&](auto fn) {
    for (size_t h = 0; h < H;) {
      if (h + 1 < H && (h + 1) / G == h / G) fn(std::integral_constant<int, 2>(), h), h += 2;
      else fn(std::integral_constant<int, 1>(), h), h += 1;
    }
  };
  // Four positions at a time, one from each quarter of the chunk (t, t + q, t + 2q, t + 3q), every
  // head of each: a position's keys (and values) for all KV heads lie together, so each quarter
  // is read front to back, four long streams as the decode products read (matmul_isa.h). Taken
  // one head at a time, the reads were 1 KiB pieces 4 KiB apart (Gemma 3's rows) and ran at 5
  // GB/s on one thread; four adjacent positions at a time, each stream a page then a jump, at
  // 21.5 GB/s from memory against 70 GB/s from L2 (docs/gemma3/decoder.md, "Decode attention").
  const size_t quarter = n / 4;
  auto by_fours = [&](auto fn) {  // fn(std::integral_constant<int, NT>(), t, step): positions t + j·step
    for (size_t t = 0; t < quarter; ++t) fn(std::integral_constant<int, 4>(), t, quarter);
    for (size_t t = 4 * quarter; t < n; ++t) fn(std::integral_constant<int, 1>(), t, size_t(1));
  };
  by_fours([&](auto nt, size_t t, size_t step) {
    pairs([&](auto ng, size_t h) {
      chunk_dots<S, ng, nt>(q + h * d, k + t * stride + h / G * d, stride, step, d, scale, p + h * n + t, n);
    });
  });
  for (size_t h = 0; h < H; ++h) l[h] = exp_shifted<S>(p + h * n, n, m + h);
  by_fours([&](auto nt, size_t t, size_t step) {
    pairs([&](auto ng, size_t h) {
      values_block<S, ng, nt>(p + h * n + t, n, v + t * stride + h / G * d, stride, step, o + h * d, d, t == 0);
    });
  });
}

template <class S>
void round_bf16_k(const float* x, float* y, size_t n) {
  size_t i = 0;
  for (; i + S::W <= n; i += S::W) S::store(y + i, S::round_bf16(S::load(x + i)));
  if (i < n) store_part<S>(y + i, S::round_bf16(load_part<S>(x + i, n - i)), n - i);
}

template <class S>
void to_bf16_k(const float* x, uint16_t* y, size_t n) {
  size_t i = 0;
  for (; i + S::W <= n; i += S::W) S::store_bf16(y + i, S::round_bf16(S::load(x + i)));
  if (i == n) return;
  uint16_t tail[S::W];
  S::store_bf16(tail, S::round_bf16(load_part<S>(x + i, n - i)));
  for (size_t j = 0; i + j < n; ++j) y[i + j] = tail[j];
}

template <class S>
constexpr OpsKernels make_ops() {
  return OpsKernels{&rms_norm_k<S>, &layer_norm_k<S>, &gelu_k<S>, &gelu_mul_k<S>, &softmax_k<S>,
                    &scaled_softmax_k<S>, &scaled_exp_k<S>, &exp_normalize_k<S>, &attend_chunk_k<S, float>,
                    &attend_chunk_k<S, uint16_t>, &round_bf16_k<S>, &to_bf16_k<S>};
}

}  // namespace vlm::kernels::detail
