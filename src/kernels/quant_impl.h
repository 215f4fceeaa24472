// The 256-bit integer block-dot kernels shared by the AVX2 and AVX512-VNNI paths. The
// including file defines QTARGET (a function attribute or nothing) and, before this
// header, `dot_u8s8(u, s)`: the sums of u8·s8 products over each group of 4 bytes, as 8
// int32 (AVX2: maddubs + madd; VNNI: vpdpbusd). Unsigned operands are the weight codes
// (offsets removed afterwards with the activation sums) or |w| with the sign moved to x.
#pragma once
#include <immintrin.h>

#include "core/dtype.h"
#include "kernels/matmul_isa.h"
#include "kernels/quant.h"
#include "kernels/quant_blocks.h"

namespace vlm::kernels::detail {
namespace {

using namespace quant_blocks;

QTARGET inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

QTARGET inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

QTARGET inline float dot_q8_0(const std::byte* row, const QBlock8* a, size_t nb) {
  __m256 acc = _mm256_setzero_ps();
  for (size_t i = 0; i < nb; ++i) {
    const auto* b = reinterpret_cast<const BlockQ8_0*>(row) + i;
    const __m256i w = load32(b->qs), x = load32(a[i].q);
    const __m256i p = dot_u8s8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(f16_to_f32(b->d) * a[i].d), acc);
  }
  return hsum(acc);
}

QTARGET inline float dot_q4_0(const std::byte* row, const QBlock8* a, size_t nb) {
  __m256 acc = _mm256_setzero_ps();
  float off = 0;
  const __m128i m4 = _mm_set1_epi8(0x0F);
  for (size_t i = 0; i < nb; ++i) {
    const auto* b = reinterpret_cast<const BlockQ4_0*>(row) + i;
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs));
    const __m256i w = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
    const float s = f16_to_f32(b->d) * a[i].d;
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(w, load32(a[i].q))), _mm256_set1_ps(s), acc);
    off += s * float(8 * (a[i].sum[0] + a[i].sum[1]));
  }
  return hsum(acc) - off;
}

QTARGET inline float dot_q4_k(const std::byte* row, const QBlock8* a, size_t nb) {
  __m256 acc = _mm256_setzero_ps();
  float off = 0;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (size_t i = 0; i < nb; ++i, a += 8) {
    const auto* b = reinterpret_cast<const BlockQ4_K*>(row) + i;
    const float d = f16_to_f32(b->d), dmin = f16_to_f32(b->dmin);
    for (int j = 0; j < 4; ++j) {
      const __m256i q = load32(b->qs + 32 * j);
      const __m256i codes[2] = {_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_srli_epi16(q, 4), m4)};
      for (int h = 0; h < 2; ++h) {
        const QBlock8& x = a[2 * j + h];
        uint8_t sc, m;
        scale_min_k4(2 * j + h, b->scales, sc, m);
        const __m256i p = dot_u8s8(codes[h], load32(x.q));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * float(sc) * x.d), acc);
        off += dmin * float(m) * x.d * float(x.sum[0] + x.sum[1]);
      }
    }
  }
  return hsum(acc) - off;
}

QTARGET inline float dot_q6_k(const std::byte* row, const QBlock8* a, size_t nb) {
  __m256 acc = _mm256_setzero_ps();
  float off = 0;
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x30);
  for (size_t i = 0; i < nb; ++i) {
    const auto* b = reinterpret_cast<const BlockQ6_K*>(row) + i;
    const float d = f16_to_f32(b->d);
    for (int half = 0; half < 2; ++half, a += 4) {
      const __m256i l0 = load32(b->ql + 64 * half), l1 = load32(b->ql + 64 * half + 32);
      const __m256i qh = load32(b->qh + 32 * half);
      const __m256i codes[4] = {
          _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2)),
          _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m2)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2)),
      };
      for (int k = 0; k < 4; ++k) {
        const QBlock8& x = a[k];
        const int8_t* sc = b->scales + 8 * half + 2 * k;
        const float s = d * x.d;
        // int32 lanes 0-3 hold values 0-15 (scale sc[0]), lanes 4-7 values 16-31 (sc[1])
        const __m256 sv = _mm256_set_m128(_mm_set1_ps(s * float(sc[1])), _mm_set1_ps(s * float(sc[0])));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(codes[k], load32(x.q))), sv, acc);
        off += s * float(32 * (sc[0] * x.sum[0] + sc[1] * x.sum[1]));
      }
    }
  }
  return hsum(acc) - off;
}

// y[m, n] for n in [n0, n1), every m: each weight row stays in L1 while it meets every
// activation row.
template <GgmlType T>
QTARGET void quant_dot(const GemmArgs& a, size_t n0, size_t n1) {
  for (size_t n = n0; n < n1; ++n) {
    const std::byte* row = a.w + n * a.ldw_bytes;
    for (size_t m = 0; m < a.M; ++m) {
      const auto* x = reinterpret_cast<const QBlock8*>(a.xq + m * a.ldxq);
      float v;
      if constexpr (T == GgmlType::Q8_0) v = dot_q8_0(row, x, a.K / 32);
      else if constexpr (T == GgmlType::Q4_0) v = dot_q4_0(row, x, a.K / 32);
      else if constexpr (T == GgmlType::Q4_K) v = dot_q4_k(row, x, a.K / 256);
      else v = dot_q6_k(row, x, a.K / 256);
      if (a.bias) v += a.bias[n];
      a.y[m * a.ldy + n] = v;
    }
  }
}

constexpr QuantKernels make_quant_kernels() {
  return {{&quant_dot<GgmlType::Q8_0>}, {&quant_dot<GgmlType::Q4_0>}, {&quant_dot<GgmlType::Q4_K>},
          {&quant_dot<GgmlType::Q6_K>}};
}

}  // namespace
}  // namespace vlm::kernels::detail
