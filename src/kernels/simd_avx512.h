// SIMD traits for AVX-512 (F/BW/VL/DQ) kernels (see matmul_impl.h and ops_impl.h for what they
// provide). Include only from files compiled for this ISA (named *_avx512.cpp); the
// type has internal linkage, so its code never leaks into other files.
#pragma once
// GCC 12 warns falsely inside its own intrinsic headers (_mm512_undefined_*, PR 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace vlm::kernels::detail {
namespace {

struct S512 {
  using V = __m512;
  static constexpr int W = 16, MR = 6, NV = 4;
  static constexpr int DOT_RM = 4, DOT_RN2 = 4;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  // The first n (<= W) lanes; the masked-off ones are neither read nor written (no fault past p + n).
  static V load_first(const float* p, size_t n, float fill) {
    return _mm512_mask_loadu_ps(_mm512_set1_ps(fill), __mmask16((1u << n) - 1), p);
  }
  static void store_first(float* p, V v, size_t n) { _mm512_mask_storeu_ps(p, __mmask16((1u << n) - 1), v); }
  static V bcast(const float* p) { return _mm512_set1_ps(*p); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static float hsum(V v) { return _mm512_reduce_add_ps(v); }
  // bf16 is the top half of an f32: widening is a zero-extend and a shift (exact).
  static V load_bf16(const uint16_t* p) {
    const __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
  }
  static V load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void transpose(V* r) {
    V t[16], u[16];
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // u[4j + c], 128-bit lane L: rows 4j..4j+3 of column 4L + c.
    for (int j = 0; j < 4; ++j) {
      const __m512d a = _mm512_castps_pd(t[4 * j]), b = _mm512_castps_pd(t[4 * j + 1]);
      const __m512d c = _mm512_castps_pd(t[4 * j + 2]), d = _mm512_castps_pd(t[4 * j + 3]);
      u[4 * j + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
      u[4 * j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
      u[4 * j + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
      u[4 * j + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    // 4×4 transpose of 128-bit lanes across u[c], u[4+c], u[8+c], u[12+c].
    for (int c = 0; c < 4; ++c) {
      const V v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44);
      const V v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
      const V v2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
      const V v3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
      r[c] = _mm512_shuffle_f32x4(v0, v2, 0x88);
      r[4 + c] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
      r[8 + c] = _mm512_shuffle_f32x4(v1, v3, 0x88);
      r[12 + c] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
    }
  }
  // ---- element-wise ops (ops_impl.h) ----
  using M = __mmask16;
  static V set1(float v) { return _mm512_set1_ps(v); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V min(V a, V b) { return _mm512_min_ps(a, b); }
  static V abs(V a) { return _mm512_abs_ps(a); }
  static float hmax(V v) { return _mm512_reduce_max_ps(v); }
  static V copysign(V mag, V sign) {
    const __m512i m = _mm512_set1_epi32(int(0x80000000u));
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_andnot_si512(m, _mm512_castps_si512(mag)),
                                               _mm512_and_si512(m, _mm512_castps_si512(sign))));
  }
  static M lt(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  static V select(M m, V a, V b) { return _mm512_mask_blend_ps(m, b, a); }  // m ? a : b
  static V round(V a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // p · 2^n for integer-valued n in [-126, 127] (one vscalefps: the product's rounding, one operation)
  static V times_pow2(V p, V n) { return _mm512_scalef_ps(p, n); }
  // f32 → bf16 (nearest even) → f32, as vlm::round_bf16: NaN stays NaN (quieted).
  static V round_bf16(V v) {
    const __m512i u = _mm512_castps_si512(v), hi = _mm512_set1_epi32(int(0xffff0000u));
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)), hi);
    const __m512i nan = _mm512_and_si512(_mm512_or_si512(u, _mm512_set1_epi32(0x400000)), hi);
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), r, nan));
  }
  // The high halves of round_bf16's words, as 16 bf16 values at p.
  static void store_bf16(uint16_t* p, V rounded) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(rounded), 16)));
  }
};

}  // namespace
}  // namespace vlm::kernels::detail
