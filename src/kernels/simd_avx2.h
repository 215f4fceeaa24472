// SIMD traits for AVX2 + FMA + F16C kernels (see matmul_impl.h and ops_impl.h for what they
// provide). Include only from files compiled for this ISA (named *_avx2.cpp); the
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

struct S256 {
  using V = __m256;
  static constexpr int W = 8, MR = 6, NV = 2;
  static constexpr int DOT_RM = 2, DOT_RN2 = 4;
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  // The first n (<= W) floats (vmaskmovps: the masked-off ones are not read), the rest fill. No
  // store_first: AMD has microcoded vmaskmovps's store form (one store per lane on Jaguar, LLVM
  // review D66801; not measured on Zen here), and one full store into a buffer forwards to the
  // copy's narrower loads.
  static V load_first(const float* p, size_t n, float fill) {
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
  }
  static V bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static float hsum(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // bf16 is the top half of an f32: widening is a zero-extend and a shift (exact).
  static V load_bf16(const uint16_t* p) {
    const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
  }
  static V load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void transpose(V* r) {
    V t[8], u[8];
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // u[4j + c], 128-bit lane L: rows 4j..4j+3 of column 4L + c.
    for (int j = 0; j < 2; ++j) {
      const __m256d a = _mm256_castps_pd(t[4 * j]), b = _mm256_castps_pd(t[4 * j + 1]);
      const __m256d c = _mm256_castps_pd(t[4 * j + 2]), d = _mm256_castps_pd(t[4 * j + 3]);
      u[4 * j + 0] = _mm256_castpd_ps(_mm256_unpacklo_pd(a, c));
      u[4 * j + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(a, c));
      u[4 * j + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(b, d));
      u[4 * j + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(b, d));
    }
    for (int c = 0; c < 4; ++c) {
      r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
      r[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
    }
  }
  // ---- element-wise ops (ops_impl.h) ----
  using M = __m256;
  static V set1(float v) { return _mm256_set1_ps(v); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static V min(V a, V b) { return _mm256_min_ps(a, b); }
  static V abs(V a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.f), a); }
  static float hmax(V v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static V copysign(V mag, V sign) {
    const V m = _mm256_set1_ps(-0.f);
    return _mm256_or_ps(_mm256_andnot_ps(m, mag), _mm256_and_ps(m, sign));
  }
  static M lt(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  static V select(M m, V a, V b) { return _mm256_blendv_ps(b, a, m); }  // m ? a : b
  static V round(V a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // p · 2^n for integer-valued n in [-126, 127] (2^n built from its exponent bits)
  static V times_pow2(V p, V n) {
    const __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(e, 23)));
  }
  // f32 → bf16 (nearest even) → f32, as vlm::round_bf16: NaN stays NaN (quieted).
  static V round_bf16(V v) {
    const __m256i u = _mm256_castps_si256(v), hi = _mm256_set1_epi32(int(0xffff0000u));
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)), hi);
    const __m256i nan = _mm256_and_si256(_mm256_or_si256(u, _mm256_set1_epi32(0x400000)), hi);
    return _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(nan), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  // The high halves of round_bf16's words, as 8 bf16 values at p (each below 2^16, so the
  // signed-to-unsigned pack keeps it).
  static void store_bf16(uint16_t* p, V rounded) {
    const __m256i h = _mm256_srli_epi32(_mm256_castps_si256(rounded), 16);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
  }
};

}  // namespace
}  // namespace vlm::kernels::detail
