// The 256-bit integer block-dot kernels shared by the AVX2 and AVX512-VNNI paths. The
// including file defines QTARGET (a function attribute or nothing) and, before this
// header, `dot_u8s8(u, s)`: the sums of u8·s8 products over each group of 4 bytes, as 8
// int32 (AVX2: maddubs + madd; VNNI: vpdpbusd). Unsigned operands are the weight codes
// (their offset times x subtracted afterwards) or |w| with the sign moved to x. The K-quants
// call vpmaddubsw and vpmaddwd themselves on either path, to multiply by their sub-block scales.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "kernels/matmul_isa.h"
#include "kernels/quant.h"
#include "kernels/quant_blocks.h"
#include "kernels/simd.h"

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
QTARGET inline float f16(uint16_t h) { return _cvtsh_ss(h); }  // exact widening (F16C)
QTARGET inline __m256 bcast(const float* p) { return _mm256_broadcast_ss(p); }
QTARGET inline __m256 bcast_f16(uint16_t h) { return _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(h))); }
// A K-quant block's d and dmin (adjacent f16) widened together: lanes 0 and 1.
template <class Block>
QTARGET inline __m128 d_dmin(const Block* b) {
  static_assert(offsetof(Block, dmin) == offsetof(Block, d) + 2);
  uint32_t v;
  std::memcpy(&v, &b->d, 4);
  return _mm_cvtph_ps(_mm_cvtsi32_si128(int(v)));
}

// Asks for the bytes of a weight row this far ahead of [p, p + n): one sequential stream per
// thread (S = 1) with this much integer work per byte left the cores waiting on memory (Q4_K/Q6_K
// decode at a third of the read bandwidth) without 8 KiB; S streams in lockstep take kRowAhead.
inline constexpr size_t kBlockAhead = 8192;
template <int S>
QTARGET inline void prefetch_ahead(const void* p, size_t n) {
  constexpr size_t ahead = S > 1 ? kRowAhead : kBlockAhead;
  for (size_t o = 0; o < n; o += 64) _mm_prefetch(static_cast<const char*>(p) + ahead + o, _MM_HINT_T0);
}

// Each kernel takes RM activation rows against S weight rows (rows[j]; dot_block32 one row, the
// M = 1 kernels dot_signed_streams and dot_nibble_streams S rows: those prepare each x block once for
// their S weight rows, while against one weight row the sign moves of each weight block serve
// all RM activation rows) and writes out[m · S + j]: a weight block is decoded once
// and meets every activation row, and every (row, weight row) sum is its own chain (for the
// 32-value formats split in two over consecutive blocks to keep FMA latency off the critical
// path; the K-quants' one FMA per 256 values does not need it). Batches below kLaneFrom rows take
// RM ≤ 4, S = 1 (larger ones lane tiles); decode RM = 1, S = 4 (dot_row1). Row: Q8Row, or Q8KRow
// for the K-quants (ActRow). d4 and s4: the RM rows' block scales and code sums side by side
// (GemmArgs::xd4, xs4), for the kernels that finish four rows' sums at once (rows4).
template <int RM, class Row = Q8Row>
struct Acts {
  Row x[RM];
  const float* d4 = nullptr;
  const int32_t* s4 = nullptr;
};

// The integer sums of up to four (activation row, weight row) pairs over one block as one vector:
// lane m holds pair m's sum over its first four int32 lanes, lane 4 + m over the last four (two
// levels of unpacks and adds; exact integers). One conversion, scale product and FMA then serve
// the four pairs: done per pair they took 46 % of a Q8_0 tile's time on Zen 3. Unpacks, not
// vphaddd: that is three operations with a throughput of one per two cycles on Zen 3.
template <int RM>
QTARGET inline __m256i rows4(const __m256i (&p)[4]) {
  static_assert(RM >= 1 && RM <= 4);
  const __m256i z = _mm256_setzero_si256();
  const __m256i p1 = RM > 1 ? p[1] : z, p2 = RM > 2 ? p[2] : z, p3 = RM > 3 ? p[3] : z;
  // s01, per 128-bit half: row 0's lanes 0+2, row 1's 0+2, row 0's 1+3, row 1's 1+3 (s23 likewise)
  const __m256i s01 = _mm256_add_epi32(_mm256_unpacklo_epi32(p[0], p1), _mm256_unpackhi_epi32(p[0], p1));
  const __m256i s23 = _mm256_add_epi32(_mm256_unpacklo_epi32(p2, p3), _mm256_unpackhi_epi32(p2, p3));
  return _mm256_add_epi32(_mm256_unpacklo_epi64(s01, s23), _mm256_unpackhi_epi64(s01, s23));
}

// out[m] = lanes m + 4 + m of the two sums of rows4 products.
template <int RM>
QTARGET inline void store_rows4(__m256 a, __m256 b, float* out) {
  const __m256 t = _mm256_add_ps(a, b);
  alignas(16) float v[4];
  _mm_store_ps(v, _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
  VLM_UNROLL
  for (int m = 0; m < RM; ++m) out[m] = v[m];
}

// The block type of a 32-value format.
template <GgmlType T>
using Block32 = std::conditional_t<
    T == GgmlType::Q8_0, BlockQ8_0,
    std::conditional_t<
        T == GgmlType::Q4_0, BlockQ4_0,
        std::conditional_t<T == GgmlType::Q4_1, BlockQ4_1,
                           std::conditional_t<T == GgmlType::Q5_0, BlockQ5_0,
                                              std::conditional_t<T == GgmlType::Q5_1, BlockQ5_1, BlockIQ4_NL>>>>>;
// The 32-value formats whose weights are signed bytes (Q8_0's codes, IQ4_NL's codebook values):
// their sign moves onto x. The others have unsigned codes.
template <GgmlType T>
inline constexpr bool kSignedWeights = T == GgmlType::Q8_0 || T == GgmlType::IQ4_NL;
// What Q4_0's and Q5_0's unsigned codes are offset by (their value is d·(code − offset)); Q4_1
// and Q5_1 have none (their value is d·code + m).
template <GgmlType T>
inline constexpr int kCodeOffset = T == GgmlType::Q4_0 ? 8 : T == GgmlType::Q5_0 ? 16 : 0;
template <GgmlType T>
inline constexpr bool kHasMin = T == GgmlType::Q4_1 || T == GgmlType::Q5_1;

// The 32 nibbles of 16 bytes in order: the low nibbles are values 0-15, the high ones 16-31 (one
// 128-bit load into both halves, the high half shifted by 4).
QTARGET inline __m256i nibbles32(const uint8_t* qs) {
  const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  return _mm256_and_si256(_mm256_srlv_epi64(q, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
}

// Bit k (0..7) of each byte of v at bit `to`, the other bits clear: 16-bit shifts, but the bit
// kept in each byte comes from the same byte.
QTARGET inline __m256i move_bit(__m256i v, int k, int to) {
  return _mm256_and_si256(k <= to ? _mm256_slli_epi16(v, to - k) : _mm256_srli_epi16(v, k - to), _mm256_set1_epi8(char(1 << to)));
}

// The IQ4 codebook's values of 32 codes (one byte shuffle).
QTARGET inline __m256i iq4_values(__m256i codes) {
  const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4Values));
  return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(table), codes);
}

// The 32 unsigned codes of a Q4_0, Q4_1, Q5_0 or Q5_1 block in order (nibbles32); Q5_0 and Q5_1 add 16
// where bit j of qh is set (AVX512: qh is the byte mask of a masked add; AVX2: byte j/8 of qh spread
// over bytes 8·(j/8).., tested against its bit, the hits turned into 0x10).
template <class Block>
QTARGET inline __m256i nibble_codes(const Block* b) {
  const __m256i low = nibbles32(b->qs);
  if constexpr (!requires { b->qh; }) {
    return low;
  } else {
    uint32_t qh;
    std::memcpy(&qh, b->qh, 4);
    if constexpr (kZmm) {
      return _mm256_mask_add_epi8(low, _cvtu32_mask32(qh), low, _mm256_set1_epi8(16));
    } else {
      const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(int(qh)),
                                                _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
      const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201));
      return _mm256_or_si256(low, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit), _mm256_set1_epi8(0x10)));
    }
  }
}

// The 32 signed weight bytes of a Q8_0 or IQ4_NL block.
template <GgmlType T>
QTARGET inline __m256i weights32(const Block32<T>* b) {
  if constexpr (T == GgmlType::Q8_0) return load32(b->qs);
  else return iq4_values(nibbles32(b->qs));
}

// Two 256-bit vectors as the halves of one 512-bit vector (the masked forms: GCC 12's unmasked
// broadcasts and inserts warn of an undefined operand).
template <class V = __m512i>
QTARGET inline V halves(__m256i lo, __m256i hi) {
  return _mm512_mask_broadcast_i64x4(_mm512_maskz_broadcast_i64x4(0xFF, lo), 0xF0, hi);
}

// kZmm: rows4 on 512-bit vectors, each 128-bit lane gathered as rows4 gathers a 256-bit one's
// (the masked forms here and below: GCC 12's unmasked 512-bit forms warn of an undefined operand).
template <class V>
QTARGET inline V rows4_lanes(const V (&p)[4]) {
  const auto lo32 = [](V a, V b) QTARGET { return _mm512_maskz_unpacklo_epi32(0xFFFF, a, b); };
  const auto hi32 = [](V a, V b) QTARGET { return _mm512_maskz_unpackhi_epi32(0xFFFF, a, b); };
  const V s01 = _mm512_add_epi32(lo32(p[0], p[1]), hi32(p[0], p[1])), s23 = _mm512_add_epi32(lo32(p[2], p[3]), hi32(p[2], p[3]));
  return _mm512_add_epi32(_mm512_maskz_unpacklo_epi64(0xFF, s01, s23), _mm512_maskz_unpackhi_epi64(0xFF, s01, s23));
}

// kZmm: int32 lanes as f32; and a 512-bit sum of two-block steps as the 256-bit loop's two
// accumulators (acc[0] the low 256 bits, acc[1] the high), which its last odd block continues.
template <class V>
QTARGET inline auto to_ps(V v) {
  return _mm512_maskz_cvtepi32_ps(0xFFFF, v);
}
template <class F>
QTARGET inline void split_halves(F acc2, __m256 (&acc)[2]) {
  acc[0] = _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, _mm512_castps_pd(acc2), 0));
  acc[1] = _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, _mm512_castps_pd(acc2), 1));
}

// The codes of blocks b[0] and b[1] (consecutive) side by side, each as nibble_codes orders them:
// the nibbles from 128-bit lanes q0, q0, q1, q1, the second and fourth shifted by 4; Q5_0 and
// Q5_1 add 16 under the mask of their two qh words (bit j is value j's fifth bit, and value j
// is byte j of a block's codes).
template <class Block, class V>
QTARGET inline V nibble_codes2(const Block* b) {
  const auto q = [](const Block* c) QTARGET { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(c->qs)); };
  const V both = _mm512_mask_broadcast_i32x4(_mm512_maskz_broadcast_i32x4(0xFFFF, q(b)), 0xFF00, q(b + 1));
  const V codes = _mm512_and_si512(_mm512_maskz_srlv_epi64(0xFF, both, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)), _mm512_set1_epi8(0x0F));
  if constexpr (!requires { b->qh; }) {
    return codes;
  } else {
    uint32_t h0, h1;
    std::memcpy(&h0, b[0].qh, 4), std::memcpy(&h1, b[1].qh, 4);
    return _mm512_mask_add_epi8(codes, _cvtu64_mask64(uint64_t(h1) << 32 | h0), codes, _mm512_set1_epi8(16));
  }
}

// The signed weight bytes of blocks b[0] and b[1] (Q8_0, IQ4_NL) side by side, as weights32 gives each.
template <GgmlType T, class V>
QTARGET inline V weights2(const Block32<T>* b) {
  if constexpr (T == GgmlType::Q8_0) {
    return halves<V>(load32(b[0].qs), load32(b[1].qs));
  } else {
    const V table = _mm512_maskz_broadcast_i32x4(0xFFFF, _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4Values)));
    return _mm512_shuffle_epi8(table, nibble_codes2<Block32<T>, V>(b));
  }
}

// The 32-value formats, RM activation rows against one weight row (prefill, batches). Q8_0 and
// IQ4_NL move the sign of each weight block onto x, so |w| is the unsigned operand for every row;
// the codes of Q4_0, Q4_1, Q5_0 and Q5_1 are unsigned already: the offset of Q4_0 and Q5_0 leaves with the
// rows' code sums (s4), which also meet the m of Q4_1 and Q5_1. The rows' block sums gather into one vector (rows4),
// scaled by d_w times the rows' d_x (d4) in one FMA. kZmm: two blocks at a time in 512-bit vectors
// as dot_nibble_streams takes them, the same integers and f32 operations in the same order as the
// 256-bit loop (its bits); batched decode of a 4B Q4_0 at M = 8 1.4× faster on Zen 5.
template <GgmlType T, int RM, class V = __m512i>
QTARGET inline void dot_block32(const std::byte* row, const Acts<RM>& a, size_t nb, float* out) {
  const auto* b = reinterpret_cast<const Block32<T>*>(row);
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  size_t i = 0;
  if constexpr (kZmm) {
    const V zero = _mm512_setzero_si512();
    // The 128-bit vectors at p (block i) and p + 4 (block i + 1) in lanes 0-1 and 2-3, or (low)
    // in lanes 0 and 2 only.
    const auto pair4 = [](const auto* p, bool low) QTARGET {
      const __m128i l = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4));
      return _mm512_mask_broadcast_i32x4(_mm512_maskz_broadcast_i32x4(low ? 0x000F : 0x00FF, l), low ? 0x0F00 : 0xFF00, h);
    };
    // The f16 `field` of blocks i and i + 1 in the low and high 256 bits, times the rows' d_x (d4).
    const auto scales = [&](uint16_t Block32<T>::*field, __m512 d4) QTARGET {
      const __m256i h = _mm256_setr_m128i(_mm_set1_epi16(short(b[i].*field)), _mm_set1_epi16(short(b[i + 1].*field)));
      return _mm512_mul_ps(_mm512_maskz_cvtph_ps(0xFFFF, h), d4);
    };
    auto acc2 = to_ps(zero);
    for (; i + 2 <= nb; i += 2) {
      prefetch_ahead<1>(b + i, 2 * sizeof(Block32<T>));
      const __m512 d4 = _mm512_castsi512_ps(pair4(a.d4 + 4 * i, false));
      V p[4] = {zero, zero, zero, zero};
      if constexpr (kSignedWeights<T>) {  // no 512-bit vpsignb: x negated under the mask of w < 0
        const V w = weights2<T, V>(b + i);
        const __mmask64 neg = _mm512_movepi8_mask(w);
        const V aw = _mm512_abs_epi8(w);
        VLM_UNROLL
        for (int m = 0; m < RM; ++m) {
          const V xm = _mm512_loadu_si512(a.x[m].q + 32 * i);
          p[m] = _mm512_dpbusd_epi32(zero, aw, _mm512_mask_sub_epi8(xm, neg, zero, xm));
        }
      } else {
        const V w = nibble_codes2<Block32<T>, V>(b + i);
        VLM_UNROLL
        for (int m = 0; m < RM; ++m) p[m] = _mm512_dpbusd_epi32(zero, w, _mm512_loadu_si512(a.x[m].q + 32 * i));
      }
      V sum = rows4_lanes(p);
      if constexpr (!kSignedWeights<T>) {
        const V s4 = pair4(a.s4 + 4 * i, true);
        if constexpr (kCodeOffset<T> != 0) sum = _mm512_sub_epi32(sum, _mm512_maskz_slli_epi32(0xFFFF, s4, kCodeOffset<T> == 8 ? 3 : 4));
        if constexpr (kHasMin<T>) acc2 = _mm512_fmadd_ps(to_ps(s4), scales(&Block32<T>::m, d4), acc2);
      }
      acc2 = _mm512_fmadd_ps(to_ps(sum), scales(&Block32<T>::d, d4), acc2);
    }
    split_halves(acc2, acc);
  }
  auto block = [&](size_t i, int s) QTARGET {
    __m256i p[4], sum;
    const __m256 d4 = _mm256_broadcast_ps(reinterpret_cast<const __m128*>(a.d4 + 4 * i));
    if constexpr (kSignedWeights<T>) {
      const __m256i w = weights32<T>(b + i), aw = _mm256_sign_epi8(w, w);
      VLM_UNROLL
      for (int m = 0; m < RM; ++m) p[m] = dot_u8s8(aw, _mm256_sign_epi8(load32(a.x[m].q + 32 * i), w));
      sum = rows4<RM>(p);
    } else {
      // The rows' code sums in lanes 0-3 (lanes 4-7 of rows4 hold the rest of each row's sum, and
      // the two halves are added at the end).
      const __m256i w = nibble_codes(b + i);
      VLM_UNROLL
      for (int m = 0; m < RM; ++m) p[m] = dot_u8s8(w, load32(a.x[m].q + 32 * i));
      const __m256i s4 = _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a.s4 + 4 * i)));
      sum = rows4<RM>(p);
      if constexpr (kCodeOffset<T> != 0) sum = _mm256_sub_epi32(sum, _mm256_slli_epi32(s4, kCodeOffset<T> == 8 ? 3 : 4));
      if constexpr (kHasMin<T>) acc[s] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s4), _mm256_mul_ps(bcast_f16(b[i].m), d4), acc[s]);
    }
    acc[s] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(bcast_f16(b[i].d), d4), acc[s]);
  };
  for (; i + 2 <= nb; i += 2) prefetch_ahead<1>(b + i, 2 * sizeof(Block32<T>)), block(i, 0), block(i + 1, 1);
  if (i < nb) block(i, 0);
  store_rows4<RM>(acc[0], acc[1], out);
}

// Batches (kLaneFrom) of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q4_K, Q5_K and Q6_K with one vector lane
// per weight row (8 rows on AVX2, 16 on AVX512): each block of the tile's rows is transposed in
// registers once, so that 32-bit lane p of codes[j] holds four codes of lane p's row, and x's four
// matching codes are broadcast to every lane (vpdpbusd's broadcast operand; AVX2 vpmaddubsw). Each
// lane then ends with its row's block sum, no sums gathered across lanes (dot_block32 gathers them
// per activation row: batched decode of a 4B Q4_0 was compute-bound at 11 GB/s on Zen 5), and one
// transposition serves every activation row. Each output is one chain over the blocks, the same
// on either ISA, so AVX512 == AVX2 bit for bit: acc = fma(f32(Σ code·x_q − 8·Σx_q), d_w·d_x, acc)
// for Q4_0 (Q5_0: 16·Σx_q, the fifth bits added to the codes from a gather of each lane's qh);
// for Q4_1 and Q5_1 acc = fma(f32(Σ code·x_q), d_w·d_x, acc), then acc = fma(f32(Σx_q), m_w·d_x,
// acc); the K-quants in lane_tile_k and lane_tile_q6_k.
template <class I>
inline constexpr int kLaneRows = int(sizeof(I) / 4);
// The vectors of the tile: 512-bit on AVX512, 256-bit on AVX2.
template <bool Zmm>
struct LaneVectors {
  using I = __m512i;
  using F = __m512;
};
template <>
struct LaneVectors<false> {
  using I = __m256i;
  using F = __m256;
};
// The four 128-bit loads of transposed vector g hold rows L·g + l (l its 128-bit lane, L of them
// per vector), and the 4×4 transposes within each 128-bit lane put dword j of row L·g + l at dword g
// of lane l of codes[j]: lane 4·l + g. pos_of(r) is row r's lane; the row of lane p is L·(p mod 4) + p/4.
template <class I>
constexpr int pos_of(int r) {
  constexpr int L = kLaneRows<I> / 4;
  return 4 * (r % L) + r / L;
}

// The codes of one block of each of the tile's rows (row r's 16 code bytes at q + r·ld), transposed:
// codes[j] holds bytes 4j..4j+3 of each row in its lane (pos_of). The rows are addressed from
// one pointer per four (GCC kept sixteen row pointers on the stack).
template <class I>
QTARGET inline void lane_codes(const uint8_t* q, size_t ld, I* c) {
  const auto at = [](const uint8_t* p) QTARGET { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); };
  const size_t ld3 = 3 * ld;
  if constexpr (sizeof(I) == 64) {
    VLM_UNROLL
    for (int g = 0; g < 4; ++g, q += 4 * ld) {
      c[g] = _mm512_maskz_broadcast_i32x4(0x000F, at(q));
      c[g] = _mm512_mask_broadcast_i32x4(c[g], 0x00F0, at(q + ld));
      c[g] = _mm512_mask_broadcast_i32x4(c[g], 0x0F00, at(q + 2 * ld));
      c[g] = _mm512_mask_broadcast_i32x4(c[g], 0xF000, at(q + ld3));
    }
    const I t0 = _mm512_maskz_unpacklo_epi32(0xFFFF, c[0], c[1]), t1 = _mm512_maskz_unpackhi_epi32(0xFFFF, c[0], c[1]);
    const I t2 = _mm512_maskz_unpacklo_epi32(0xFFFF, c[2], c[3]), t3 = _mm512_maskz_unpackhi_epi32(0xFFFF, c[2], c[3]);
    c[0] = _mm512_maskz_unpacklo_epi64(0xFF, t0, t2), c[1] = _mm512_maskz_unpackhi_epi64(0xFF, t0, t2);
    c[2] = _mm512_maskz_unpacklo_epi64(0xFF, t1, t3), c[3] = _mm512_maskz_unpackhi_epi64(0xFF, t1, t3);
  } else {
    VLM_UNROLL
    for (int g = 0; g < 4; ++g, q += 2 * ld) c[g] = _mm256_setr_m128i(at(q), at(q + ld));
    const I t0 = _mm256_unpacklo_epi32(c[0], c[1]), t1 = _mm256_unpackhi_epi32(c[0], c[1]);
    const I t2 = _mm256_unpacklo_epi32(c[2], c[3]), t3 = _mm256_unpackhi_epi32(c[2], c[3]);
    c[0] = _mm256_unpacklo_epi64(t0, t2), c[1] = _mm256_unpackhi_epi64(t0, t2);
    c[2] = _mm256_unpacklo_epi64(t1, t3), c[3] = _mm256_unpackhi_epi64(t1, t3);
  }
}

// vpshufb operands of the lane tiles (either width loads its first bytes): each dword's
// bytes from bytes f0-f3 of the same dword (−1: zero).
struct alignas(64) LaneShuffle {
  uint8_t b[64];
};
constexpr LaneShuffle lane_shuffle(int f0, int f1, int f2, int f3) {
  LaneShuffle s{};
  const int from[4] = {f0, f1, f2, f3};
  for (int i = 0; i < 64; ++i) s.b[i] = from[i % 4] < 0 ? 0x80 : uint8_t(i % 16 / 4 * 4 + from[i % 4]);
  return s;
}
// Byte b zero-extended (kLaneByte), in both int16 halves (kLanePair) or in all four bytes (kLaneSplat).
constexpr LaneShuffle kLaneByte[4] = {lane_shuffle(0, -1, -1, -1), lane_shuffle(1, -1, -1, -1), lane_shuffle(2, -1, -1, -1),
                                      lane_shuffle(3, -1, -1, -1)};
constexpr LaneShuffle kLanePair[4] = {lane_shuffle(0, -1, 0, -1), lane_shuffle(1, -1, 1, -1), lane_shuffle(2, -1, 2, -1),
                                      lane_shuffle(3, -1, 3, -1)};
constexpr LaneShuffle kLaneSplat[4] = {lane_shuffle(0, 0, 0, 0), lane_shuffle(1, 1, 1, 1), lane_shuffle(2, 2, 2, 2),
                                       lane_shuffle(3, 3, 3, 3)};
// Q6_K's signed scales: byte b in the top byte of the dword (kLaneTop) or of both int16 halves
// (kLaneTopPair), and bytes 2t, 2t + 1 in the top bytes of the two halves (kLaneTopTwo); an
// arithmetic shift right then extends their signs (LaneOps::sscale, spair).
constexpr LaneShuffle kLaneTop[4] = {lane_shuffle(-1, -1, -1, 0), lane_shuffle(-1, -1, -1, 1), lane_shuffle(-1, -1, -1, 2),
                                     lane_shuffle(-1, -1, -1, 3)};
constexpr LaneShuffle kLaneTopPair[4] = {lane_shuffle(-1, 0, -1, 0), lane_shuffle(-1, 1, -1, 1), lane_shuffle(-1, 2, -1, 2),
                                         lane_shuffle(-1, 3, -1, 3)};
constexpr LaneShuffle kLaneTopTwo[2] = {lane_shuffle(-1, 0, -1, 1), lane_shuffle(-1, 2, -1, 3)};
// Bytes 2t and 2t + 1 zero-extended into the two int16 halves (Q4_K's and Q5_K's mins in pairs).
constexpr LaneShuffle kLaneTwo[2] = {lane_shuffle(0, -1, 1, -1), lane_shuffle(2, -1, 3, -1)};
// Vector-width forms of the few operations the lane tiles need.
template <class I>
struct LaneOps {
  using F = typename LaneVectors<sizeof(I) == 64>::F;
  QTARGET static I set1(int v) {
    if constexpr (sizeof(I) == 64) return _mm512_set1_epi32(v);
    else return _mm256_set1_epi32(v);
  }
  QTARGET static F set1f(float v) {
    if constexpr (sizeof(I) == 64) return _mm512_set1_ps(v);
    else return _mm256_set1_ps(v);
  }
  QTARGET static F zero() { return set1f(0.f); }
  QTARGET static I nibbles(I c, int shift) {  // bits shift..shift+3 of each byte
    if constexpr (sizeof(I) == 64) return _mm512_and_si512(_mm512_maskz_srli_epi16(0xFFFFFFFF, c, unsigned(shift)), _mm512_set1_epi8(0x0F));
    else return _mm256_and_si256(_mm256_srli_epi16(c, shift), _mm256_set1_epi8(0x0F));
  }
  // The dwords at base + off[p] (the f16 scales at the start of each lane's block).
  QTARGET static I gather(const std::byte* base, I off) {
    if constexpr (sizeof(I) == 64) return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), 0xFFFF, off, base, 1);
    else return _mm256_i32gather_epi32(reinterpret_cast<const int*>(base), off, 1);
  }
  // The f16 values in the low (shift 0) or high (16) halves of the dwords, as f32.
  QTARGET static F f16_half(I v, int shift) {
    if constexpr (sizeof(I) == 64) {
      return _mm512_maskz_cvtph_ps(0xFFFF, _mm512_maskz_cvtepi32_epi16(0xFFFF, _mm512_maskz_srli_epi32(0xFFFF, v, unsigned(shift))));
    } else {
      const __m256i w = _mm256_shuffle_epi8(_mm256_srli_epi32(v, shift), _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                                                                       0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1));
      return _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64(w, 0x08)));
    }
  }
  // x's codes 4k..4k+3 in every lane.
  QTARGET static I bx(const int8_t* x, int k) {
    int v;
    std::memcpy(&v, x + 4 * k, 4);
    return set1(v);
  }
  // AVX512: acc + vpdpbusd of the lanes' codes w against x's codes 4k..4k+3 as its broadcast
  // operand (one load-op; GCC loads the broadcast into a register of its own first).
  QTARGET static void dpbusd(I& acc, I w, const int8_t* x, int k) {
    asm("vpdpbusd %[x]%{1to16%}, %[w], %[acc]" : [acc] "+v"(acc) : [w] "v"(w), [x] "m"(*reinterpret_cast<const int32_t*>(x + 4 * k)));
  }
  // init + Σ over j < N of each lane's codes c[j] (four values, as lane_codes transposes them)
  // against x's codes 4j..4j+3. AVX512: dpbusd, in two chains for eight codes and one for four
  // (Q6_K's sub-blocks: two chains and their add were 6 % slower at M = 8 on an Emerald Rapids
  // VM). AVX2: widened_sum (Per·2·max code·127 < 2^15).
  template <int N, int Per = N>
  QTARGET static I code_sum(const I* c, const int8_t* x, int init) {
    if constexpr (sizeof(I) == 64) {
      I s = set1(init);
      if constexpr (N <= 4) {
        VLM_UNROLL
        for (int j = 0; j < N; ++j) dpbusd(s, c[j], x, j);
        return s;
      } else {
        I t = _mm512_setzero_si512();
        VLM_UNROLL
        for (int j = 0; j < N; ++j) dpbusd(j % 2 ? t : s, c[j], x, j);
        return _mm512_add_epi32(s, t);
      }
    } else {
      return add(set1(init), widened_sum<N, Per>(c, x, _mm256_set1_epi16(1)));
    }
  }
  // AVX2: Σ over j < N of c[j] against x's codes 4j..4j+3 as int16 pair sums (vpmaddubsw), Per
  // codes at a time, each group's pairs multiplied by mul's int16 halves and widened (vpmaddwd).
  template <int N, int Per>
  QTARGET static I widened_sum(const I* c, const int8_t* x, I mul) {
    I s = _mm256_setzero_si256();
    VLM_UNROLL
    for (int g = 0; g < N / Per; ++g) {
      I s16 = _mm256_setzero_si256();
      VLM_UNROLL
      for (int j = Per * g; j < Per * (g + 1); ++j) s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(c[j], bx(x, j)));
      s = add(s, _mm256_madd_epi16(s16, mul));
    }
    return s;
  }
  // The K-quant tiles' sub-block sums: code_sum times the sub-block's scale in int32. AVX512:
  // vpmulld, the scale one int32 per lane; AVX2: widened_sum with the scale in both int16 halves
  // of the lane. uscale gives either form of byte b of each lane (Q5_K's six-bit scales), sscale
  // of a signed byte (Q6_K's).
  template <int N, int Per>
  QTARGET static I scaled_sum(const I* c, const int8_t* x, I scale) {
    if constexpr (sizeof(I) == 64) return mullo(code_sum<N>(c, x, 0), scale);
    else return widened_sum<N, Per>(c, x, scale);
  }
  // AVX512: acc + s·(low int16 of pairs) + t·(high int16) per lane, for sums s and t that each fit
  // an int16: packed into a lane's halves for one vpdpwssd.
  QTARGET static I dot_halves(I acc, I s, I t, I pairs) {
    return _mm512_dpwssd_epi32(acc, _mm512_mask_blend_epi16(0xAAAAAAAA, s, _mm512_maskz_slli_epi32(0xFFFF, t, 16)), pairs);
  }
  // acc + the same sum where each of code_sum's two chains (the even and the odd j) fits in int16
  // (Q4_K: 16 products of at most 15·127) and scale is the int16 pair of either ISA (kLanePair):
  // AVX512 packs the two chains into a lane's halves and multiplies them in one vpdpwssd, two
  // operations in place of vpmulld's two and an add.
  template <int N, int Per>
  QTARGET static I add_scaled_halves(I acc, const I* c, const int8_t* x, I scale) {
    if constexpr (sizeof(I) == 64) {
      I s = _mm512_setzero_si512(), t = _mm512_setzero_si512();
      VLM_UNROLL
      for (int j = 0; j < N; ++j) dpbusd(j % 2 ? t : s, c[j], x, j);
      return dot_halves(acc, s, t, scale);
    } else {
      return add(acc, widened_sum<N, Per>(c, x, scale));
    }
  }
  // acc + the sums of c[0..3] against x's codes 0-15 and of c[4..7] against 16-31 (two 16-value
  // sub-blocks, each at most 16·3·127: Q2_K), times the int16 pair `scales` (the first sub-block's
  // in the low half): AVX512 packs the two sums into a lane's halves for one vpdpwssd; AVX2 sums
  // each in int16 pairs (vpmaddubsw) and widens it by its own scale (vpmaddwd).
  QTARGET static I add_sub_blocks_scaled(I acc, const I* c, const int8_t* x, I scales) {
    if constexpr (sizeof(I) == 64) {
      I s = _mm512_setzero_si512(), t = _mm512_setzero_si512();
      VLM_UNROLL
      for (int j = 0; j < 8; ++j) dpbusd(j < 4 ? s : t, c[j], x, j);
      return dot_halves(acc, s, t, scales);
    } else {
      I s = _mm256_setzero_si256(), t = _mm256_setzero_si256();
      VLM_UNROLL
      for (int j = 0; j < 8; ++j) {
        const I p = _mm256_maddubs_epi16(c[j], bx(x, j));
        if (j < 4) s = _mm256_add_epi16(s, p);
        else t = _mm256_add_epi16(t, p);
      }
      const I lo = _mm256_blend_epi16(scales, _mm256_slli_epi32(scales, 16), 0xAA);  // (a, a)
      const I hi = _mm256_blend_epi16(_mm256_srli_epi32(scales, 16), scales, 0xAA);  // (b, b)
      return add(acc, add(_mm256_madd_epi16(s, lo), _mm256_madd_epi16(t, hi)));
    }
  }
  QTARGET static I uscale(I bytes, int b) {
    if constexpr (sizeof(I) == 64) return pick(bytes, kLaneByte[b]);
    else return pick(bytes, kLanePair[b]);
  }
  // The same forms of signed byte b (Q6_K's scales).
  QTARGET static I sscale(I bytes, int b) {
    if constexpr (sizeof(I) == 64) return _mm512_maskz_srai_epi32(0xFFFF, pick(bytes, kLaneTop[b]), 24);
    else return _mm256_srai_epi16(pick(bytes, kLaneTopPair[b]), 8);
  }
  // Signed bytes 2t and 2t + 1 of each lane as its two int16 halves (pair_dot's pairs).
  QTARGET static I spair(I bytes, int t) {
    if constexpr (sizeof(I) == 64) return _mm512_maskz_srai_epi16(0xFFFFFFFF, pick(bytes, kLaneTopTwo[t]), 8);
    else return _mm256_srai_epi16(pick(bytes, kLaneTopTwo[t]), 8);
  }
  // acc + the two int16 products of pairs (kLanePair) with the int16 pair at bs in each
  // lane (vpdpwssd; AVX2 vpmaddwd).
  QTARGET static I pair_dot(I acc, I pairs, const int16_t* bs) {
    int v;
    std::memcpy(&v, bs, 4);
    if constexpr (sizeof(I) == 64) return _mm512_dpwssd_epi32(acc, pairs, set1(v));
    else return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, set1(v)));
  }
  QTARGET static I pick(I v, const LaneShuffle& s) {
    if constexpr (sizeof(I) == 64) return _mm512_shuffle_epi8(v, _mm512_load_si512(s.b));
    else return _mm256_shuffle_epi8(v, _mm256_load_si256(reinterpret_cast<const __m256i*>(s.b)));
  }
  QTARGET static I add(I a, I b) {
    if constexpr (sizeof(I) == 64) return _mm512_add_epi32(a, b);
    else return _mm256_add_epi32(a, b);
  }
  QTARGET static I sub(I a, I b) {
    if constexpr (sizeof(I) == 64) return _mm512_sub_epi32(a, b);
    else return _mm256_sub_epi32(a, b);
  }
  QTARGET static I sub16(I a, I b) {
    if constexpr (sizeof(I) == 64) return _mm512_sub_epi16(a, b);
    else return _mm256_sub_epi16(a, b);
  }
  QTARGET static I mullo(I a, I b) {
    if constexpr (sizeof(I) == 64) return _mm512_mullo_epi32(a, b);
    else return _mm256_mullo_epi32(a, b);
  }
  QTARGET static I band(I a, I b) {
    if constexpr (sizeof(I) == 64) return _mm512_and_si512(a, b);
    else return _mm256_and_si256(a, b);
  }
  QTARGET static I bor(I a, I b) {
    if constexpr (sizeof(I) == 64) return _mm512_or_si512(a, b);
    else return _mm256_or_si256(a, b);
  }
  // 32-bit shifts; a byte mask afterwards keeps what stayed within each byte.
  QTARGET static I srli(I v, int n) {
    if constexpr (sizeof(I) == 64) return _mm512_maskz_srli_epi32(0xFFFF, v, unsigned(n));
    else return _mm256_srli_epi32(v, n);
  }
  QTARGET static I slli(I v, int n) {
    if constexpr (sizeof(I) == 64) return _mm512_maskz_slli_epi32(0xFFFF, v, unsigned(n));
    else return _mm256_slli_epi32(v, n);
  }
  // c (the codes of values 4k..4k+3 in each lane) plus 16 where bits 4k..4k+3 of the lane's qh
  // are set (Q5_0, Q5_1): qh's byte k/2 in each byte of the lane, tested against its bit.
  QTARGET static I add_fifth_bits(I c, I qh, int k) {
    const I bits = pick(qh, kLaneSplat[k / 2]), sel = set1(k % 2 ? int(0x80402010) : 0x08040201);
    if constexpr (sizeof(I) == 64) return _mm512_mask_add_epi8(c, _mm512_test_epi8_mask(bits, sel), c, _mm512_set1_epi8(16));
    else return bor(c, band(_mm256_cmpeq_epi8(band(bits, sel), sel), _mm256_set1_epi8(16)));
  }
  // The IQ4 codebook's values of the codes (iq4_values).
  QTARGET static I iq4(I codes) {
    if constexpr (sizeof(I) == 64) {
      const I table = _mm512_maskz_broadcast_i32x4(0xFFFF, _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4Values)));
      return _mm512_shuffle_epi8(table, codes);
    } else {
      return iq4_values(codes);
    }
  }
  // Bit k of each byte at bit `to`, the byte's other bits clear (the free move_bit).
  QTARGET static I move_bit(I v, int k, int to) {
    if constexpr (sizeof(I) == 64) return band(k <= to ? slli(v, to - k) : srli(v, k - to), set1(0x01010101 << to));
    else return detail::move_bit(v, k, to);
  }
  // Σ w·x over one block of signed weights w (Q8_0, IQ4_NL; c as code_sum takes it, from
  // signed_weights), sx = Σ x: vpdpbusd of w + 128 from a start of −128·sx; AVX2 vpmaddubsw of
  // |w| and x with w's sign (|w| + 128 overflows its int16 pair sums), each pair widened at once.
  QTARGET static I signed_weights(I w) {
    if constexpr (sizeof(I) == 64) return _mm512_xor_si512(w, _mm512_set1_epi8(char(0x80)));
    else return w;
  }
  QTARGET static I signed_sum(const I (&c)[8], const int8_t* x, int32_t sx) {
    if constexpr (sizeof(I) == 64) {
      return code_sum<8>(c, x, -128 * sx);
    } else {
      I s = _mm256_setzero_si256();
      VLM_UNROLL
      for (int j = 0; j < 8; ++j)
        s = add(s, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(c[j], c[j]), _mm256_sign_epi8(bx(x, j), c[j])), _mm256_set1_epi16(1)));
      return s;
    }
  }
  QTARGET static F to_f32(I v) {
    if constexpr (sizeof(I) == 64) return _mm512_maskz_cvtepi32_ps(0xFFFF, v);
    else return _mm256_cvtepi32_ps(v);
  }
  QTARGET static F fma(F a, F b, F c) {
    if constexpr (sizeof(I) == 64) return _mm512_fmadd_ps(a, b, c);
    else return _mm256_fmadd_ps(a, b, c);
  }
  QTARGET static F mul(F a, F b) {
    if constexpr (sizeof(I) == 64) return _mm512_mul_ps(a, b);
    else return _mm256_mul_ps(a, b);
  }
  QTARGET static F fnmadd(F a, F b, F c) {
    if constexpr (sizeof(I) == 64) return _mm512_fnmadd_ps(a, b, c);
    else return _mm256_fnmadd_ps(a, b, c);
  }
  // y[r] (+ bias[r]) = v's lane pos_of(r), for rows r < n.
  QTARGET static void store(F v, const float* bias, float* y, int n) {
    alignas(64) float t[kLaneRows<I>];
    if constexpr (sizeof(I) == 64) _mm512_store_ps(t, v);
    else _mm256_store_ps(t, v);
    for (int r = 0; r < n; ++r) y[r] = bias ? t[pos_of<I>(r)] + bias[r] : t[pos_of<I>(r)];
  }
};

// Each lane's byte offset in the tile (its row's, pos_of, plus at), for a gather.
template <class I>
QTARGET inline I lane_offsets(size_t ldw, size_t at) {
  constexpr int R = kLaneRows<I>;
  alignas(64) int32_t off[R];
  VLM_UNROLL
  for (int p = 0; p < R; ++p) off[p] = int32_t(size_t((R / 4) * (p % 4) + p / 4) * ldw + at);
  I v;
  std::memcpy(&v, off, sizeof v);
  return v;
}

// A lane tile asks for the next tile's rows (the bytes after its own) evenly over its nb blocks,
// one step per block: the tile reads R streams, and ahead of each row lies the next row, which
// this tile reads already. Into L2: in L1 the next tile's rows (23 KiB of Q4_K at K = 2560) and the
// activation rows pushed each other out (replayed x8 step of a 4B Q4_K_M 5 % faster; docs/gguf.md).
struct NextTile {
  const char *at, *to;
  size_t step;
  NextTile(const std::byte* tile, size_t bytes, size_t nb)
      : at(reinterpret_cast<const char*>(tile + bytes)), to(at), step(bytes / nb) {}
  QTARGET void ask() {
    for (to += step; at < to; at += 64) _mm_prefetch(at, _MM_HINT_T1);
  }
};

// Activation rows [m0, m0 + RM) against the kLaneRows weight rows at w, ldw bytes apart: y[m, r]
// for rows r < rows (y: row m0's outputs for them, rows ldy apart).
template <GgmlType T, int RM, class I>
QTARGET inline void lane_tile(const GemmArgs& a, const std::byte* w, size_t ldw, size_t m0, const float* bias, float* y, int rows) {
  using Block = Block32<T>;
  using Ops = LaneOps<I>;
  using F = typename Ops::F;
  constexpr int R = kLaneRows<I>;
  const size_t nb = a.K / 32;
  constexpr bool five = T == GgmlType::Q5_0 || T == GgmlType::Q5_1;
  const I offv = lane_offsets<I>(ldw, 0);
  I qhv{};
  if constexpr (five) qhv = lane_offsets<I>(ldw, offsetof(Block, qh));
  Q8Row x[RM];
  const int32_t* s[RM];
  F acc[RM];
  VLM_UNROLL
  for (int m = 0; m < RM; ++m) {
    const size_t mm = m0 + size_t(m);
    x[m] = q8_row(a.xq + mm * a.ldxq, a.K);
    s[m] = a.xs4 + mm / 4 * nb * 4 + mm % 4;
    acc[m] = Ops::zero();
  }
  NextTile next(w, R * ldw, nb);
  const auto* b = reinterpret_cast<const Block*>(w);
  for (size_t i = 0; i < nb; ++i) {
    next.ask();
    I c[8];  // values 0-15 in c[0..3], 16-31 in c[4..7]
    if constexpr (T == GgmlType::Q8_0) {
      const auto* q = reinterpret_cast<const uint8_t*>(b[i].qs);
      lane_codes<I>(q, ldw, c), lane_codes<I>(q + 16, ldw, c + 4);
    } else {
      lane_codes<I>(b[i].qs, ldw, c + 4);
      VLM_UNROLL
      for (int j = 0; j < 4; ++j) c[j] = Ops::nibbles(c[4 + j], 0), c[4 + j] = Ops::nibbles(c[4 + j], 4);
    }
    if constexpr (T == GgmlType::IQ4_NL) {
      VLM_UNROLL
      for (int j = 0; j < 8; ++j) c[j] = Ops::iq4(c[j]);
    }
    if constexpr (kSignedWeights<T>) {
      VLM_UNROLL
      for (int j = 0; j < 8; ++j) c[j] = Ops::signed_weights(c[j]);
    } else if constexpr (five) {
      const I qh = Ops::gather(reinterpret_cast<const std::byte*>(b + i), qhv);
      VLM_UNROLL
      for (int k = 0; k < 8; ++k) c[k] = Ops::add_fifth_bits(c[k], qh, k);
    }
    const I h = Ops::gather(reinterpret_cast<const std::byte*>(b + i), offv);
    const F dw = Ops::f16_half(h, 0);
    VLM_UNROLL
    for (int m = 0; m < RM; ++m) {
      const int32_t sx = s[m][4 * i];
      const F dwx = Ops::mul(dw, Ops::set1f(x[m].d[i]));
      const int8_t* xq = x[m].q + 32 * i;
      // AVX2: 16 products of at most 15·127 per int16, or 8 of 31·127 (Q5_0, Q5_1)
      const I sum = kSignedWeights<T> ? Ops::signed_sum(c, xq, sx) : Ops::template code_sum<8, five ? 4 : 8>(c, xq, -kCodeOffset<T> * sx);
      acc[m] = Ops::fma(Ops::to_f32(sum), dwx, acc[m]);
      if constexpr (kHasMin<T>) acc[m] = Ops::fma(Ops::set1f(float(sx)), Ops::mul(Ops::f16_half(h, 16), Ops::set1f(x[m].d[i])), acc[m]);
    }
  }
  VLM_UNROLL
  for (int m = 0; m < RM; ++m) Ops::store(acc[m], bias, y + size_t(m) * a.ldy, rows);
}

// The activation rows [m0, m0 + RM) of a K-quant lane tile (Q8_K) and their outputs' chains.
template <int RM, class I>
struct KTileRows {
  Q8KRow x[RM];
  typename LaneOps<I>::F acc[RM];
  QTARGET KTileRows(const GemmArgs& a, size_t m0) {
    VLM_UNROLL
    for (int m = 0; m < RM; ++m) x[m] = q8k_row(a.xq + (m0 + size_t(m)) * a.ldxq, a.K), acc[m] = LaneOps<I>::zero();
  }
  QTARGET void store(const GemmArgs& a, const float* bias, float* y, int rows) const {
    VLM_UNROLL
    for (int m = 0; m < RM; ++m) LaneOps<I>::store(acc[m], bias, y + size_t(m) * a.ldy, rows);
  }
  // Block i's finish for the formats with mins (Q2_K, Q4_K, Q5_K): the N pairs of sub-block mins
  // against each row's activation sums (sums(m): the pairs of int16 at sums(m) + 2t), then
  // acc = fma(f32(sum), d·d_x, acc), acc = fnmadd(f32(Σ m·bsum), dmin·d_x, acc).
  template <int N, class Sums>
  QTARGET void finish_mins(size_t i, const I* sum, const I (&mins)[N], Sums sums, typename LaneOps<I>::F dw,
                           typename LaneOps<I>::F dmin) {
    using Ops = LaneOps<I>;
    VLM_UNROLL
    for (int m = 0; m < RM; ++m) {
      I ms = Ops::set1(0);
      VLM_UNROLL
      for (int t = 0; t < N; ++t) ms = Ops::pair_dot(ms, mins[t], sums(m) + 2 * t);
      const auto dx = Ops::set1f(x[m].d[i]);
      acc[m] = Ops::fma(Ops::to_f32(sum[m]), Ops::mul(dw, dx), acc[m]);
      acc[m] = Ops::fnmadd(Ops::to_f32(ms), Ops::mul(dmin, dx), acc[m]);
    }
  }
  // Block i's finish where every code carries an offset 2^shift (Q3_K: 4, Q6_K: 32) that leaves
  // through the 16-value sub-blocks' scale pairs against the bsums:
  // acc = fma(f32(sum − 2^shift·Σ pairs·bsums), d·d_x, acc).
  QTARGET void finish_offset(size_t i, const I* sum, const I (&pairs)[8], typename LaneOps<I>::F dw, int shift) {
    using Ops = LaneOps<I>;
    VLM_UNROLL
    for (int m = 0; m < RM; ++m) {
      I off = Ops::set1(0);
      VLM_UNROLL
      for (int t = 0; t < 8; ++t) off = Ops::pair_dot(off, pairs[t], x[m].bsums + 16 * i + 2 * t);
      acc[m] = Ops::fma(Ops::to_f32(Ops::sub(sum[m], Ops::slli(off, shift))), Ops::mul(dw, Ops::set1f(x[m].d[i])), acc[m]);
    }
  }
};

// Q4_K and Q5_K (Block) on lane tiles, as lane_tile takes the 32-value formats: per block, the
// rows' 16-byte heads transpose as codes do, so lane p holds its row's d and dmin (dword 0) and
// the three words of packed scales and mins (dwords 1-3), unpacked in the lanes as
// scales_mins_k4 unpacks them; each pair of 32-value sub-blocks transposes from the 32 bytes of
// their nibbles (Q5_K: and of qh). The block's integer sums are dot_k4's: sub-block sums times
// their scales (scaled_sum), the mins against the activation sums per 32 (GemmArgs::xs32;
// pair_dot with two sub-blocks' mins in the int16 halves), finished as dot_k4 finishes them,
// in one chain per output:
// acc = fma(f32(Σ sc·Σ q·x), d·d_x, acc), acc = fnmadd(f32(Σ m·bsum), dmin·d_x, acc).
template <class Block, int RM, class I>
QTARGET inline void lane_tile_k(const GemmArgs& a, const std::byte* w, size_t ldw, size_t m0, const float* bias, float* y,
                                int rows) {
  constexpr bool five = std::is_same_v<Block, BlockQ5_K>;
  using Ops = LaneOps<I>;
  const size_t nb = a.K / 256;
  KTileRows<RM, I> r(a, m0);
  NextTile next(w, kLaneRows<I> * ldw, nb);
  const auto* b = reinterpret_cast<const Block*>(w);
  for (size_t i = 0; i < nb; ++i) {
    next.ask();
    I h[4];
    lane_codes<I>(reinterpret_cast<const uint8_t*>(b + i), ldw, h);
    // Bytes j of sc[0] and sc[1]: the scales of sub-blocks j and 4 + j (mins likewise): the low
    // six bits of words 0 (1), or the nibbles of word 2 with the top two bits of word 0 (1).
    const I six = Ops::set1(0x3F3F3F3F), four = Ops::set1(0x0F0F0F0F), top = Ops::set1(0x30303030);
    const I sc[2] = {Ops::band(h[1], six), Ops::bor(Ops::band(h[3], four), Ops::band(Ops::srli(h[1], 2), top))};
    const I mn[2] = {Ops::band(h[2], six), Ops::bor(Ops::band(Ops::srli(h[3], 4), four), Ops::band(Ops::srli(h[2], 2), top))};
    I qh[8];  // Q5_K: bit k of each qh byte is the fifth bit of sub-block k's value
    if constexpr (five) lane_codes<I>(b[i].qh, ldw, qh), lane_codes<I>(b[i].qh + 16, ldw, qh + 4);
    I sum[RM];
    VLM_UNROLL
    for (int m = 0; m < RM; ++m) sum[m] = Ops::set1(0);
    // Not unrolled: unrolled, GCC spilled the codes of the four pairs (309 vector stack accesses
    // against 50) and ran no faster.
#pragma GCC unroll 1
    for (int c = 0; c < 4; ++c) {
      // Sub-blocks 2c (low nibbles) and 2c + 1 (high), each as code_sum takes a block.
      I sub[2][8], q[8];
      lane_codes<I>(b[i].qs + 32 * c, ldw, q), lane_codes<I>(b[i].qs + 32 * c + 16, ldw, q + 4);
      VLM_UNROLL
      for (int j = 0; j < 8; ++j) sub[0][j] = Ops::nibbles(q[j], 0), sub[1][j] = Ops::nibbles(q[j], 4);
      if constexpr (five) {
        VLM_UNROLL
        for (int j = 0; j < 8; ++j)
          sub[0][j] = Ops::bor(sub[0][j], Ops::move_bit(qh[j], 2 * c, 4)), sub[1][j] = Ops::bor(sub[1][j], Ops::move_bit(qh[j], 2 * c + 1, 4));
      }
      // Q4_K's int16 pair sums hold 16 products of at most 15·127, Q5_K's 8 of 31·127.
      constexpr int per = five ? 4 : 8;
      // Sub-block 2c + h's scale: Q5_K's as scaled_sum takes it (uscale), Q4_K's as the pair of
      // add_scaled_halves (Q4_K's two chains of 16 products fit int16, Q5_K's do not).
      const auto scale = [&](int h) QTARGET {
        const int b = 2 * (c % 2) + h;
        return five ? Ops::uscale(sc[c / 2], b) : Ops::pick(sc[c / 2], kLanePair[b]);
      };
      const I s0 = scale(0), s1 = scale(1);
      VLM_UNROLL
      for (int m = 0; m < RM; ++m) {
        const int8_t* xq = r.x[m].q + 256 * i + 64 * size_t(c);
        if constexpr (five)
          sum[m] = Ops::add(sum[m], Ops::add(Ops::template scaled_sum<8, per>(sub[0], xq, s0),
                                             Ops::template scaled_sum<8, per>(sub[1], xq + 32, s1)));
        else
          sum[m] = Ops::template add_scaled_halves<8, per>(Ops::template add_scaled_halves<8, per>(sum[m], sub[0], xq, s0),
                                                           sub[1], xq + 32, s1);
      }
    }
    I mins[4];  // sub-blocks 2t and 2t + 1's mins in the halves of mins[t]
    VLM_UNROLL
    for (int t = 0; t < 4; ++t) mins[t] = Ops::pick(mn[t / 2], kLaneTwo[t % 2]);
    r.finish_mins(i, sum, mins, [&](int m) { return a.xs32 + (m0 + size_t(m)) * (a.K / 32) + 8 * i; },
                  Ops::f16_half(h[0], 0), Ops::f16_half(h[0], 16));
  }
  r.store(a, bias, y, rows);
}

// Q6_K on lane tiles, as lane_tile_k takes Q4_K: per block, the rows' sixteen int8 sub-block
// scales transpose as codes do (sc[j]: scales 4j..4j+3 of lane p's row) and d is gathered; for
// chunks k and k + 2 of a half (values 32k.. and 64 + 32k..) the 32 bytes of ql they share and the
// half's 32 bytes of qh transpose, and their six-bit codes come together in the lanes as
// dot_q6_k puts them together. The block's integer sum is dot_q6_k's: each 16-value sub-block's
// code sum times its scale (scaled_sum; AVX2 adds two vpmaddubsw results, each at most 2·63·127,
// before it widens) less 32·Σ sc·bsum (pair_dot with the scales in pairs), then
// acc = fma(f32(sum), d·d_x, acc): one chain per output.
template <int RM, class I>
QTARGET inline void lane_tile_q6_k(const GemmArgs& a, const std::byte* w, size_t ldw, size_t m0, const float* bias, float* y,
                                   int rows) {
  using Ops = LaneOps<I>;
  const size_t nb = a.K / 256;
  KTileRows<RM, I> r(a, m0);
  // The dword that ends with d (one at d would run past the block, and past the tensor at its end).
  const I doff = lane_offsets<I>(ldw, offsetof(BlockQ6_K, d) - 2);
  const I m30 = Ops::set1(0x30303030);
  NextTile next(w, kLaneRows<I> * ldw, nb);
  const auto* b = reinterpret_cast<const BlockQ6_K*>(w);
  for (size_t i = 0; i < nb; ++i) {
    next.ask();
    I sc[4];
    lane_codes<I>(reinterpret_cast<const uint8_t*>(b[i].scales), ldw, sc);
    I sum[RM];
    VLM_UNROLL
    for (int m = 0; m < RM; ++m) sum[m] = Ops::set1(0);
#pragma GCC unroll 1
    for (int half = 0; half < 2; ++half) {
      I h[8];  // the half's qh, transposed once for both of its chunk pairs
      lane_codes<I>(b[i].qh + 32 * half, ldw, h), lane_codes<I>(b[i].qh + 32 * half + 16, ldw, h + 4);
#pragma GCC unroll 1
      for (int k = 0; k < 2; ++k) {  // chunks k (low nibbles) and k + 2 (high)
        I l[8], c[2][8];
        lane_codes<I>(b[i].ql + 64 * half + 32 * k, ldw, l), lane_codes<I>(b[i].ql + 64 * half + 32 * k + 16, ldw, l + 4);
        VLM_UNROLL
        for (int d = 0; d < 8; ++d) {
          // qh's bits 2k, 2k + 1 (chunk k) and 2k + 4, 2k + 5 (chunk k + 2) at bits 4-5 of each byte
          c[0][d] = Ops::bor(Ops::nibbles(l[d], 0), Ops::band(Ops::slli(h[d], 4 - 2 * k), m30));
          c[1][d] = Ops::bor(Ops::nibbles(l[d], 4), Ops::band(k ? Ops::srli(h[d], 2) : h[d], m30));
        }
        VLM_UNROLL
        for (int t = 0; t < 2; ++t) {
          const int s0 = 8 * half + 2 * (k + 2 * t);  // the chunk's two sub-blocks: s0, s0 + 1
          const I lo = Ops::sscale(sc[s0 / 4], s0 % 4), hi = Ops::sscale(sc[s0 / 4], s0 % 4 + 1);
          VLM_UNROLL
          for (int m = 0; m < RM; ++m) {
            const int8_t* xq = r.x[m].q + 256 * i + 128 * size_t(half) + 32 * size_t(k + 2 * t);
            sum[m] = Ops::add(sum[m], Ops::add(Ops::template scaled_sum<4, 2>(c[t], xq, lo),
                                               Ops::template scaled_sum<4, 2>(c[t] + 4, xq + 16, hi)));
          }
        }
      }
    }
    I pairs[8];
    VLM_UNROLL
    for (int t = 0; t < 8; ++t) pairs[t] = Ops::spair(sc[t / 2], t % 2);
    r.finish_offset(i, sum, pairs, Ops::f16_half(Ops::gather(reinterpret_cast<const std::byte*>(b + i), doff), 16), 5);
  }
  r.store(a, bias, y, rows);
}

// Q2_K on lane tiles: per block, the rows' sixteen scale bytes transpose as codes do (sc[k]:
// sub-blocks 4k..4k+3, the scale in the low nibble, the min in the high one), and each half's 32
// code bytes transpose once for its four 32-value chunks (chunk j: bits 2j, 2j + 1 of every byte).
// A chunk's two 16-value sub-blocks meet their scales in one step (add_sub_blocks_scaled), the mins
// the activation sums per 16 (bsums) in pairs, and acc = fma(f32(Σ sc·Σ q·x_q), d·d_x, acc), then
// acc = fnmadd(f32(Σ m·bsum), dmin·d_x, acc): one chain per output, the same on both ISAs.
template <int RM, class I>
QTARGET inline void lane_tile_q2_k(const GemmArgs& a, const std::byte* w, size_t ldw, size_t m0, const float* bias,
                                   float* y, int rows) {
  using Ops = LaneOps<I>;
  const size_t nb = a.K / 256;
  KTileRows<RM, I> r(a, m0);
  const I doff = lane_offsets<I>(ldw, offsetof(BlockQ2_K, d));  // d and dmin
  const I nib = Ops::set1(0x000F000F), two = Ops::set1(0x03030303);
  NextTile next(w, kLaneRows<I> * ldw, nb);
  const auto* b = reinterpret_cast<const BlockQ2_K*>(w);
  for (size_t i = 0; i < nb; ++i) {
    next.ask();
    I sc[4];
    lane_codes<I>(b[i].scales, ldw, sc);
    I sum[RM];
    VLM_UNROLL
    for (int m = 0; m < RM; ++m) sum[m] = Ops::set1(0);
#pragma GCC unroll 1
    for (int n = 0; n < 2; ++n) {
      I q[8];
      lane_codes<I>(b[i].qs + 32 * n, ldw, q), lane_codes<I>(b[i].qs + 32 * n + 16, ldw, q + 4);
#pragma GCC unroll 1
      for (int j = 0; j < 4; ++j) {
        I c[8];
        VLM_UNROLL
        for (int k = 0; k < 8; ++k) c[k] = Ops::band(Ops::srli(q[k], 2 * j), two);
        const int s = 8 * n + 2 * j;  // the chunk's sub-blocks s and s + 1
        const I scales = Ops::band(Ops::pick(sc[s / 4], kLaneTwo[s % 4 / 2]), nib);
        VLM_UNROLL
        for (int m = 0; m < RM; ++m)
          sum[m] = Ops::add_sub_blocks_scaled(sum[m], c, r.x[m].q + 256 * i + 128 * size_t(n) + 32 * size_t(j), scales);
      }
    }
    I mins[8];  // sub-blocks 2t and 2t + 1's mins in the halves of mins[t]
    VLM_UNROLL
    for (int t = 0; t < 8; ++t) mins[t] = Ops::band(Ops::srli(Ops::pick(sc[t / 2], kLaneTwo[t % 2]), 4), nib);
    const I dd = Ops::gather(reinterpret_cast<const std::byte*>(b + i), doff);
    r.finish_mins(i, sum, mins, [&](int m) { return r.x[m].bsums + 16 * i; }, Ops::f16_half(dd, 0), Ops::f16_half(dd, 16));
  }
  r.store(a, bias, y, rows);
}

// Q3_K on lane tiles, as lane_tile_q2_k takes Q2_K: the twelve scale bytes transpose (read from the
// dword before them, so that the read ends inside the block) and unpack in the lanes as q3_k_scales
// does, each half's `hmask` and `qs` bytes transpose once for its four chunks (q = the two bits of
// qs, bit 4·half + j of hmask as bit 2), and a chunk's two sub-block sums (at most 16·7·127) meet
// their scale pair sc − 32 in one step; the −4 of every code leaves through the scale pairs against
// the bsums, and acc = fma(f32(Σ sc·Σ q·x_q − 4·Σ sc·bsum), d·d_x, acc): one chain per output.
template <int RM, class I>
QTARGET inline void lane_tile_q3_k(const GemmArgs& a, const std::byte* w, size_t ldw, size_t m0, const float* bias,
                                   float* y, int rows) {
  using Ops = LaneOps<I>;
  const size_t nb = a.K / 256;
  KTileRows<RM, I> r(a, m0);
  const I doff = lane_offsets<I>(ldw, offsetof(BlockQ3_K, d) - 2);  // the dword that ends with d
  const I low = Ops::set1(0x0F0F0F0F), two = Ops::set1(0x03030303), off32 = Ops::set1(0x00200020);
  NextTile next(w, kLaneRows<I> * ldw, nb);
  const auto* b = reinterpret_cast<const BlockQ3_K*>(w);
  for (size_t i = 0; i < nb; ++i) {
    next.ask();
    I h[4];  // dwords 1-3: the scale bytes 0-3, 4-7, 8-11
    lane_codes<I>(reinterpret_cast<const uint8_t*>(b[i].scales) - 4, ldw, h);
    const I sc[4] = {Ops::bor(Ops::band(h[1], low), Ops::slli(Ops::band(h[3], two), 4)),
                     Ops::bor(Ops::band(h[2], low), Ops::slli(Ops::band(Ops::srli(h[3], 2), two), 4)),
                     Ops::bor(Ops::band(Ops::srli(h[1], 4), low), Ops::slli(Ops::band(Ops::srli(h[3], 4), two), 4)),
                     Ops::bor(Ops::band(Ops::srli(h[2], 4), low), Ops::slli(Ops::band(Ops::srli(h[3], 6), two), 4))};
    I pairs[8];  // sub-blocks 2t and 2t + 1's sc − 32 in the int16 halves of pairs[t]
    VLM_UNROLL
    for (int t = 0; t < 8; ++t) pairs[t] = Ops::sub16(Ops::pick(sc[t / 2], kLaneTwo[t % 2]), off32);
    I sum[RM];
    VLM_UNROLL
    for (int m = 0; m < RM; ++m) sum[m] = Ops::set1(0);
#pragma GCC unroll 1
    for (int n = 0; n < 2; ++n) {
      I q[8], hm[8];
      lane_codes<I>(b[i].qs + 32 * n, ldw, q), lane_codes<I>(b[i].qs + 32 * n + 16, ldw, q + 4);
      lane_codes<I>(b[i].hmask, ldw, hm), lane_codes<I>(b[i].hmask + 16, ldw, hm + 4);
#pragma GCC unroll 1
      for (int j = 0; j < 4; ++j) {
        I c[8];
        VLM_UNROLL
        for (int k = 0; k < 8; ++k) c[k] = Ops::bor(Ops::band(Ops::srli(q[k], 2 * j), two), Ops::move_bit(hm[k], 4 * n + j, 2));
        VLM_UNROLL
        for (int m = 0; m < RM; ++m)
          sum[m] = Ops::add_sub_blocks_scaled(sum[m], c, r.x[m].q + 256 * i + 128 * size_t(n) + 32 * size_t(j), pairs[4 * n + j]);
      }
    }
    r.finish_offset(i, sum, pairs, Ops::f16_half(Ops::gather(reinterpret_cast<const std::byte*>(b + i), doff), 16), 2);
  }
  r.store(a, bias, y, rows);
}

// IQ4_XS on lane tiles: per block, the rows' heads transpose as codes do (dword 0: d and scales_h,
// dword 1: scales_l), each sub-block's signed scale ls − 32 is put together in the lanes, and each
// 32-value sub-block's 16 code bytes are taken as IQ4_NL's block in lane_tile (nibbles, the codebook
// shuffle, the signed sum from a start of −128·Σx_q: GemmArgs::xs32), times the scale in int32 and
// summed over the block (at most 8·32·32·127·127 < 2^31); then acc = fma(f32(sum), d·d_x, acc), one
// chain per output, the same on both ISAs.
template <int RM, class I>
QTARGET inline void lane_tile_iq4_xs(const GemmArgs& a, const std::byte* w, size_t ldw, size_t m0, const float* bias,
                                     float* y, int rows) {
  using Ops = LaneOps<I>;
  using F = typename Ops::F;
  const size_t nb = a.K / 256, ng = a.K / 32;
  KTileRows<RM, I> r(a, m0);
  NextTile next(w, kLaneRows<I> * ldw, nb);
  const auto* b = reinterpret_cast<const BlockIQ4_XS*>(w);
  for (size_t i = 0; i < nb; ++i) {
    next.ask();
    I h[4];
    lane_codes<I>(reinterpret_cast<const uint8_t*>(b + i), ldw, h);
    I sum[RM];
    VLM_UNROLL
    for (int m = 0; m < RM; ++m) sum[m] = Ops::set1(0);
#pragma GCC unroll 1
    for (int j = 0; j < 8; ++j) {
      // ls: nibble j of scales_l (dword 1), bits 2j, 2j + 1 of scales_h (the top half of dword 0) above it
      const I scale = Ops::sub(Ops::bor(Ops::band(Ops::srli(h[1], 4 * j), Ops::set1(0x0F)),
                                        Ops::band(Ops::srli(h[0], 12 + 2 * j), Ops::set1(0x30))),
                               Ops::set1(32));
      I c[8];  // values 0-15 in c[0..3], 16-31 in c[4..7]
      lane_codes<I>(b[i].qs + 16 * j, ldw, c + 4);
      VLM_UNROLL
      for (int k = 0; k < 4; ++k) c[k] = Ops::nibbles(c[4 + k], 0), c[4 + k] = Ops::nibbles(c[4 + k], 4);
      VLM_UNROLL
      for (int k = 0; k < 8; ++k) c[k] = Ops::signed_weights(Ops::iq4(c[k]));
      VLM_UNROLL
      for (int m = 0; m < RM; ++m) {
        const int32_t sx = a.xs32[(m0 + size_t(m)) * ng + 8 * i + size_t(j)];
        sum[m] = Ops::add(sum[m], Ops::mullo(Ops::signed_sum(c, r.x[m].q + 256 * i + 32 * size_t(j), sx), scale));
      }
    }
    const F dw = Ops::f16_half(h[0], 0);
    VLM_UNROLL
    for (int m = 0; m < RM; ++m) r.acc[m] = Ops::fma(Ops::to_f32(sum[m]), Ops::mul(dw, Ops::set1f(r.x[m].d[i])), r.acc[m]);
  }
  r.store(a, bias, y, rows);
}

// The batches that take lane tiles: Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and IQ4_XS from M = 2, Q4_K,
// Q5_K, Q2_K and Q3_K from 4, Q8_0 and Q6_K from 5. Below, a tile's two transpositions per block (Q8_0) or
// sixteen read streams per thread (the K-quants, memory-bound at M = 2: median 0.92 against 0.83 ms
// for a 10240 × 2560 Q4_K matrix on Zen 5, even at M = 3) cost more than the row kernels' passes of
// up to four rows (Q8_0 at M = 2: 0.87 against 0.66 ms; Q6_K at M = 4, one thread from cache, 0.40
// against 0.39 ms, at M = 5 0.43 against 0.47 on an Emerald Rapids VM). IQ4_XS's row kernels are
// the slower already at M = 2 (0.30 against 0.20 ms from cache, 0.76-0.78 against 0.58-0.71 from
// memory on that VM).
template <GgmlType T>
inline constexpr size_t kLaneFrom =
    T == GgmlType::Q4_0 || T == GgmlType::Q4_1 || T == GgmlType::Q5_0 || T == GgmlType::Q5_1 || T == GgmlType::IQ4_NL ||
            T == GgmlType::IQ4_XS
        ? 2
    : T == GgmlType::Q4_K || T == GgmlType::Q5_K || T == GgmlType::Q2_K || T == GgmlType::Q3_K ? 4
    : T == GgmlType::Q8_0 || T == GgmlType::Q6_K ? 5
                                                 : 0;  // none (quant_dot refuses to build)
// Tiles of kLaneRows weight rows, each against every activation row in groups of up to kLaneM.
// A range's last tile ends at n1, overlapping the one before it (whose rows it computes again,
// to the same bits); a range of fewer rows is copied into a tile of its own, its last row repeated.
template <GgmlType T>
QTARGET inline void dot_lanes(const GemmArgs& a, size_t n0, size_t n1) {
  using I = typename LaneVectors<kZmm>::I;
  constexpr size_t R = kZmm ? 16 : 8, kLaneM = 8;  // R: kLaneRows<I>; kLaneM: 1.1x faster than 4 on AVX2 too
  thread_local std::vector<std::byte> pad;
  for (size_t n = n0; n < n1; n += R) {
    const std::byte* w = a.w + n * a.ldw_bytes;
    size_t ldw = a.ldw_bytes, t = n;
    const int rows = int(std::min(R, n1 - n));
    if (size_t(rows) < R && n1 - n0 >= R) {
      t = n1 - R, w = a.w + t * a.ldw_bytes;
    } else if (size_t(rows) < R) {
      ldw = quant_row_bytes(T, a.K);
      pad.resize(R * ldw);
      for (size_t r = 0; r < R; ++r) std::memcpy(pad.data() + r * ldw, w + std::min(r, size_t(rows) - 1) * a.ldw_bytes, ldw);
      w = pad.data();
    }
    const int out = t == n ? rows : int(R);
    const float* bias = a.bias ? a.bias + t : nullptr;
    const auto tile = [&](auto rm, size_t m) QTARGET {
      constexpr int RM = decltype(rm)::value;
      float* y = a.y + m * a.ldy + t;
      if constexpr (T == GgmlType::Q4_K) lane_tile_k<BlockQ4_K, RM, I>(a, w, ldw, m, bias, y, out);
      else if constexpr (T == GgmlType::Q5_K) lane_tile_k<BlockQ5_K, RM, I>(a, w, ldw, m, bias, y, out);
      else if constexpr (T == GgmlType::Q6_K) lane_tile_q6_k<RM, I>(a, w, ldw, m, bias, y, out);
      else if constexpr (T == GgmlType::IQ4_XS) lane_tile_iq4_xs<RM, I>(a, w, ldw, m, bias, y, out);
      else if constexpr (T == GgmlType::Q2_K) lane_tile_q2_k<RM, I>(a, w, ldw, m, bias, y, out);
      else if constexpr (T == GgmlType::Q3_K) lane_tile_q3_k<RM, I>(a, w, ldw, m, bias, y, out);
      else lane_tile<T, RM, I>(a, w, ldw, m, bias, y, out);
    };
    size_t m = 0;
    for (; m + kLaneM <= a.M; m += kLaneM) tile(std::integral_constant<int, int(kLaneM)>{}, m);
    switch (a.M - m) {
      case 7: tile(std::integral_constant<int, 7>{}, m); break;
      case 6: tile(std::integral_constant<int, 6>{}, m); break;
      case 5: tile(std::integral_constant<int, 5>{}, m); break;
      case 4: tile(std::integral_constant<int, 4>{}, m); break;
      case 3: tile(std::integral_constant<int, 3>{}, m); break;
      case 2: tile(std::integral_constant<int, 2>{}, m); break;
      case 1: tile(std::integral_constant<int, 1>{}, m); break;
      default: break;
    }
  }
}

// The f16 values at member `field` of the S streams' block i as one 64-bit word (stream j in bits
// 16j..16j + 15, absent streams zero), put together in a general register. Built from eight
// word inserts, the vectors below took the shuffle port of an Intel core that the codes'
// broadcasts and the rows4 unpacks need too: on an Emerald Rapids VM, M = 1 from cache ran
// 1.2x (Q4_0, Q5_0) to 1.5x (Q4_1, Q5_1) faster this way (docs/gguf.md, "Decode streams").
template <int S, class Block>
QTARGET inline uint64_t stream_word(const Block* const* b, size_t i, uint16_t Block::*field) {
  static_assert(S >= 1 && S <= 4);
  uint64_t w = 0;
  VLM_UNROLL
  for (int j = 0; j < S; ++j) w |= uint64_t(b[j][i].*field) << (16 * j);
  return w;
}

// Those values in lanes 0-3 and again in lanes 4-7, as f32.
template <int S, class Block>
QTARGET inline __m256 stream_f16(const Block* const* b, size_t i, uint16_t Block::*field) {
  return _mm256_cvtph_ps(_mm_set1_epi64x(int64_t(stream_word<S>(b, i, field))));
}

// The four streams' values of blocks i (128-bit lanes 0 and 1) and i + 1 (lanes 2 and 3) as f32,
// times d_x of blocks i and i + 1: the scales of a rows4_lanes sum.
template <class Block, class V = __m512>
QTARGET inline V stream_scales2(const Block* const* b, size_t i, uint16_t Block::*field, const float* dx) {
  const __m256i h = _mm256_mask_set1_epi64(_mm256_set1_epi64x(int64_t(stream_word<4>(b, i, field))), 0xC,
                                           int64_t(stream_word<4>(b, i + 1, field)));
  const V x = _mm512_mask_broadcastss_ps(_mm512_set1_ps(dx[i]), 0xFF00, _mm_load_ss(dx + i + 1));
  return _mm512_mul_ps(_mm512_maskz_cvtph_ps(0xFFFF, h), x);
}

// Q4_0, Q4_1, Q5_0 and Q5_1 at M = 1, one activation row against S weight rows: the unsigned codes
// meet x directly, less the products of the offset with x (once per x block for the S rows; the m
// of Q4_1 and Q5_1 meets the sum of x instead); the S rows' block sums gather into one vector (rows4) and meet
// their d_w·d_x in one conversion and FMA. kZmm, S = 4: two blocks at a time in 512-bit vectors
// (nibble_codes2, rows4_lanes), the same integer sums, products and order of the f32 sums as two
// steps of the 256-bit loop (acc[0] in the low 256 bits, acc[1] in the high), so the result is
// the 256-bit loop's bit for bit. The 256-bit loop held Q4_0 decode to 41-50 % of the read
// bandwidth on Zen 5 (docs/gguf.md, "Products on the blocks").
template <GgmlType T, int S, class V = __m512i>
QTARGET inline void dot_nibble_streams(const std::byte* const* rows, const Q8Row& x, size_t nb, float* out) {
  static_assert(S == 1 || S == 4);
  using Block = Block32<T>;
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  const auto* const* b = reinterpret_cast<const Block* const*>(rows);
  size_t i = 0;
  if constexpr (kZmm && S == 4) {
    const V zero = _mm512_setzero_si512();
    auto acc2 = to_ps(zero);
    for (; i + 2 <= nb; i += 2) {
      VLM_UNROLL
      for (int j = 0; j < S; ++j) prefetch_ahead<S>(b[j] + i, 2 * sizeof(Block));
      const V xq = _mm512_loadu_si512(x.q + 32 * i);
      V p[4];
      if constexpr (kCodeOffset<T> != 0) {
        const V off = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(kCodeOffset<T>), xq));
        VLM_UNROLL
        for (int j = 0; j < S; ++j) p[j] = _mm512_dpbusd_epi32(off, nibble_codes2<Block, V>(b[j] + i), xq);
      } else {
        VLM_UNROLL
        for (int j = 0; j < S; ++j) p[j] = _mm512_dpbusd_epi32(zero, nibble_codes2<Block, V>(b[j] + i), xq);
        const V sx = _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(1), xq), sxs[4] = {sx, sx, sx, sx};
        acc2 = _mm512_fmadd_ps(to_ps(rows4_lanes(sxs)), stream_scales2(b, i, &Block::m, x.d), acc2);
      }
      acc2 = _mm512_fmadd_ps(to_ps(rows4_lanes(p)), stream_scales2(b, i, &Block::d, x.d), acc2);
    }
    split_halves(acc2, acc);
  }
  auto block = [&](size_t i, int h) QTARGET {
    const __m256i xq = load32(x.q + 32 * i);
    const __m256 dx = bcast(x.d + i);
    __m256i p[4];
    if constexpr (kCodeOffset<T> != 0) {
      const __m256i off = dot_u8s8(_mm256_set1_epi8(kCodeOffset<T>), xq);
      VLM_UNROLL
      for (int j = 0; j < S; ++j) p[j] = _mm256_sub_epi32(dot_u8s8(nibble_codes(b[j] + i), xq), off);
    } else {
      VLM_UNROLL
      for (int j = 0; j < S; ++j) p[j] = dot_u8s8(nibble_codes(b[j] + i), xq);
      const __m256i sx = dot_u8s8(_mm256_set1_epi8(1), xq);
      const __m256i sxs[4] = {sx, sx, sx, sx};
      acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(rows4<S>(sxs)), _mm256_mul_ps(stream_f16<S>(b, i, &Block::m), dx), acc[h]);
    }
    acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(rows4<S>(p)), _mm256_mul_ps(stream_f16<S>(b, i, &Block::d), dx), acc[h]);
  };
  for (; i + 2 <= nb; i += 2) {
    VLM_UNROLL
    for (int j = 0; j < S; ++j) prefetch_ahead<S>(b[j] + i, 2 * sizeof(Block));
    block(i, 0), block(i + 1, 1);
  }
  if (i < nb) block(i, 0);
  store_rows4<S>(acc[0], acc[1], out);
}

// A Q4_K or Q5_K block's eight six-bit sub-block scales (bytes 0-7) and mins (bytes 8-15) as
// ggml's get_scale_min_k4 gives them for j = 0..7, unpacked in one 128-bit vector: scales 0-3 are
// the low 6 bits of word 0, scales 4-7 the low nibbles of word 2 with the top two bits of word 0,
// the mins likewise from words 1 and 2 (docs/gguf.md §2). The 16-byte load runs 4 bytes into
// the block's codes, which the masks drop. The steps, the same in each 128-bit lane for
// scales_mins_k4 and scales_mins_k4x4: words (0, 2, 1, 2) shifted right by kK4LowShift and masked
// to their low bits, or'ed with words (0, 0, 1, 1) shifted right by 2 and masked to the top two.
struct alignas(16) K4Lane {
  uint32_t w[4];
};
constexpr K4Lane kK4LowShift{{0, 0, 0, 4}}, kK4LowMask{{0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f}},
    kK4TopMask{{0, 0x30303030, 0, 0x30303030}};
constexpr int kK4LowWords = _MM_SHUFFLE(2, 1, 2, 0), kK4TopWords = _MM_SHUFFLE(1, 1, 0, 0);
QTARGET inline __m128i k4_lane(const K4Lane& c) { return _mm_load_si128(reinterpret_cast<const __m128i*>(c.w)); }
QTARGET inline __m128i scales_mins_k4(const uint8_t* scales) {
  const __m128i w = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales));  // words 0, 1, 2
  const __m128i low =
      _mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(w, kK4LowWords), k4_lane(kK4LowShift)), k4_lane(kK4LowMask));
  const __m128i top = _mm_and_si128(_mm_srli_epi32(_mm_shuffle_epi32(w, kK4TopWords), 2), k4_lane(kK4TopMask));
  return _mm_or_si128(low, top);
}
// scales_mins_k4 of four weight rows' blocks at once (row j's in 128-bit lane j), widened to int16:
// rows 0 and 1 in out[0], 2 and 3 in out[1], each row's 16 values (scales, then mins) in one
// 256-bit half. The same bytes as four calls with a third of the operations (M = 1 decode, where
// unpacking one row at a time was a fifth of a Q4_K block's work). A template so that only the
// AVX512 file instantiates it.
template <class Block, class V = __m512i>
QTARGET inline void scales_mins_k4x4(const std::byte* const* rows, size_t i, V (&out)[2]) {
  auto scales = [&](int j) { return reinterpret_cast<const __m128i*>((reinterpret_cast<const Block*>(rows[j]) + i)->scales); };
  auto lanes = [](const K4Lane& c) { return V(_mm512_maskz_broadcast_i32x4(0xFFFF, k4_lane(c))); };
  V w = _mm512_zextsi128_si512(_mm_loadu_si128(scales(0)));
  w = _mm512_inserti32x4(w, _mm_loadu_si128(scales(1)), 1);
  w = _mm512_inserti32x4(w, _mm_loadu_si128(scales(2)), 2);
  w = _mm512_inserti32x4(w, _mm_loadu_si128(scales(3)), 3);
  const V low = _mm512_and_si512(
      _mm512_maskz_srlv_epi32(0xFFFF, _mm512_maskz_shuffle_epi32(0xFFFF, w, _MM_PERM_ENUM(kK4LowWords)), lanes(kK4LowShift)),
      lanes(kK4LowMask));
  const V top = _mm512_and_si512(
      _mm512_maskz_srli_epi32(0xFFFF, _mm512_maskz_shuffle_epi32(0xFFFF, w, _MM_PERM_ENUM(kK4TopWords)), 2), lanes(kK4TopMask));
  const V sm = _mm512_or_si512(low, top);
  out[0] = _mm512_cvtepu8_epi16(_mm512_maskz_extracti64x4_epi64(0xF, sm, 0));
  out[1] = _mm512_cvtepu8_epi16(_mm512_maskz_extracti64x4_epi64(0xF, sm, 1));
}

// The f32 sums of the 256-value kernels: RM activation rows × S weight rows, each to its hsum.
template <int RM, int S>
QTARGET inline void zero_sums(__m256 (&acc)[RM][S]) {
  VLM_UNROLL
  for (int m = 0; m < RM; ++m) {
    VLM_UNROLL
    for (int j = 0; j < S; ++j) acc[m][j] = _mm256_setzero_ps();
  }
}
template <int RM, int S>
QTARGET inline void store_sums(const __m256 (&acc)[RM][S], float* out) {
  VLM_UNROLL
  for (int m = 0; m < RM; ++m) {
    VLM_UNROLL
    for (int j = 0; j < S; ++j) out[m * S + j] = hsum(acc[m][j]);
  }
}

// Keeps v's running sum a chain in one register: GCC otherwise reassociates the integer adds of
// a block into a tree whose partial sums it spills (with four activation rows, a third of the
// tile's time went to stack loads and stores: perf annotate, Zen 3).
QTARGET inline void keep_chain(__m256i& v) { asm("" : "+x"(v)); }

// vpshufb operands, each one 256-bit constant read from memory where it is used (built in
// registers, GCC kept eight of them live and spilled the sums): of a vector with eight int16 in
// each 128-bit half, kPick[k] takes int16 k to all 16 lanes, kPickPair[k] int16 2k to the low
// half's lanes and 2k + 1 to the high half's.
struct alignas(32) ShuffleBytes {
  uint8_t b[32];
};
constexpr ShuffleBytes shuffle_bytes(int lo, int hi) {
  ShuffleBytes s{};
  for (int i = 0; i < 32; ++i) s.b[i] = uint8_t(2 * (i < 16 ? lo : hi) + (i & 1));
  return s;
}
constexpr ShuffleBytes kPick[8] = {shuffle_bytes(0, 0), shuffle_bytes(1, 1), shuffle_bytes(2, 2), shuffle_bytes(3, 3),
                                   shuffle_bytes(4, 4), shuffle_bytes(5, 5), shuffle_bytes(6, 6), shuffle_bytes(7, 7)};
constexpr ShuffleBytes kPickPair[4] = {shuffle_bytes(0, 1), shuffle_bytes(2, 3), shuffle_bytes(4, 5), shuffle_bytes(6, 7)};
QTARGET inline __m256i shuffle(__m256i v, const ShuffleBytes& s) { return _mm256_shuffle_epi8(v, load32(s.b)); }
// The 512-bit form (kZmm) for a vector whose four 128-bit lanes hold the same eight int16: its
// low 256 bits take int16 2c to every lane, its high 256 bits int16 2c + 1.
struct alignas(64) ShuffleBytes64 {
  ShuffleBytes lo, hi;
};
constexpr ShuffleBytes64 kPickZ[4] = {
    {kPick[0], kPick[1]}, {kPick[2], kPick[3]}, {kPick[4], kPick[5]}, {kPick[6], kPick[7]}};
// For 64 Q4_K code bytes (sub-blocks 4p .. 4p + 3): the low nibbles hold sub-blocks 4p and 4p + 2,
// the high ones 4p + 1 and 4p + 3; kPickK4[2p + h] takes their scales to the two 256-bit halves.
constexpr ShuffleBytes64 kPickK4[4] = {{kPick[0], kPick[2]}, {kPick[1], kPick[3]}, {kPick[4], kPick[6]}, {kPick[5], kPick[7]}};
constexpr ShuffleBytes64 kPickPairZ[2] = {{kPickPair[0], kPickPair[1]}, {kPickPair[2], kPickPair[3]}};
// vpermw indices for scales_mins_k4x4's rows: kMinPairs[h] takes the mins of the row in half h
// (int16 16h + 8 .. 16h + 15) to int16 2t and 2t + 1, one for each of the x sums per 16 that
// sub-block t covers (the low 256 bits; the high ones are not used).
struct alignas(64) PermuteWords {
  uint16_t w[32];
};
constexpr PermuteWords min_pairs(int h) {
  PermuteWords p{};
  for (int t = 0; t < 32; ++t) p.w[t] = uint16_t(16 * h + 8 + t / 2 % 8);
  return p;
}
constexpr PermuteWords kMinPairs[2] = {min_pairs(0), min_pairs(1)};
// The kZmm loops' steps, templates so that only the AVX512 file instantiates them: sum += the
// pair sums of codes × 64 activations x, times scale (int16 pairs by vpmaddubsw, then vpdpwssd:
// the 256-bit loops' vpmaddwd and add in one); and a 512-bit sum's halves added.
template <class V>
QTARGET inline void add_scaled_pairs(V& sum, V codes, V x, V scale) {
  sum = _mm512_dpwssd_epi32(sum, _mm512_maddubs_epi16(codes, x), scale);
}
template <class V>
QTARGET inline void add_scaled_pairs(V& sum, V codes, const int8_t* x, V scale) {
  add_scaled_pairs(sum, codes, V(_mm512_loadu_si512(x)), scale);
}
template <class V>
QTARGET inline __m256i fold_halves(V v) {
  return _mm256_add_epi32(_mm512_maskz_extracti64x4_epi64(0xF, v, 0), _mm512_maskz_extracti64x4_epi64(0xF, v, 1));
}

// acc += sum · d_dx − (the mins against x's sums per 16) · dmin_dx for block i of activation row
// x, with d_dx and dmin_dx the weight block's d and dmin times x's d in every lane: its exact
// integer sums as two conversions and FMAs.
QTARGET inline void finish_with_mins(__m256& acc, __m256 d_dx, __m256 dmin_dx, const Q8KRow& x, size_t i, __m256i sum,
                                     __m256i mins) {
  const __m256i msum = _mm256_madd_epi16(load32(x.bsums + 16 * i), mins);
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), d_dx, acc);
  acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), dmin_dx, acc);
}
// The same with ddw = d_dmin of the weight block.
QTARGET inline void finish_with_mins(__m256& acc, __m128 ddw, const Q8KRow& x, size_t i, __m256i sum, __m256i mins) {
  const __m128 s = _mm_mul_ps(ddw, _mm_broadcast_ss(x.d + i));
  finish_with_mins(acc, _mm256_broadcastss_ps(s), _mm256_broadcastss_ps(_mm_movehdup_ps(s)), x, i, sum, mins);
}
// Block i's d and dmin of four weight rows times d_x into out (2j and 2j + 1: row j's): the
// products finish_with_mins forms one row at a time, with one conversion and one multiply for the
// four, each then broadcast from memory by the load ports rather than by a shuffle.
template <class Block>
QTARGET inline void d_dmin4(const std::byte* const* rows, size_t i, float dx, float* out) {
  const auto word = [&](int j) { return _mm_loadu_si32(&(reinterpret_cast<const Block*>(rows[j]) + i)->d); };
  const __m128i h = _mm_unpacklo_epi64(_mm_unpacklo_epi32(word(0), word(1)), _mm_unpacklo_epi32(word(2), word(3)));
  _mm256_store_ps(out, _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(dx)));
}

// Q4_K or Q5_K (Block) against Q8_K activations (one scale per 256): a 32-value sub-block's
// codes meet x as int16 pair sums (vpmaddubsw), and vpmaddwd multiplies them by the sub-block's
// scale while it sums them in int32, so the whole block stays one integer sum (exact: at most
// 8·2·2·31·127·63 per lane). The mins meet the activation sums per 16 (bsums) in one more
// vpmaddwd. Then two conversions and two FMAs per block finish it: with a scale per 32
// activations, a conversion and an FMA per sub-block were the kernel's cost (docs/gguf.md, "What
// holds the K-quant kernels"). Q5_K's fifth code bit of sub-block k is bit k of each qh byte.
template <class Block, int RM, int S>
QTARGET inline void dot_k4(const std::byte* const* rows, const Acts<RM, Q8KRow>& a, size_t nb, float* out) {
  constexpr bool five = std::is_same_v<Block, BlockQ5_K>;
  constexpr bool decode4 = kZmm && RM == 1 && S == 4;
  __m256 acc[RM][S];
  zero_sums(acc);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m128i pairs = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
  for (size_t i = 0; i < nb; ++i) {
    // One activation row: its 256 values regrouped once for the S weight rows, so that each 64
    // code bytes (two pairs of sub-blocks) meet x as two 512-bit vectors, low nibbles and high
    // (docs/gguf.md, "Products on the blocks").
    [[maybe_unused]] __m512i xz[4];
    if constexpr (kZmm && RM == 1) {
      const int8_t* x = a.x[0].q + 256 * i;
      VLM_UNROLL
      for (int h = 0; h < 4; ++h)  // h = 2p + (high nibbles): values 128p + 32·(h & 1) + {0..31, 64..95}
        xz[h] = _mm512_maskz_inserti64x4(0xFF, _mm512_castsi256_si512(load32(x + 128 * (h / 2) + 32 * (h % 2))),
                                   load32(x + 128 * (h / 2) + 32 * (h % 2) + 64), 1);
    }
    // Decode (decode4): the four weight rows' scales, mins and d, dmin unpacked together.
    [[maybe_unused]] __m512i sm16[2];
    [[maybe_unused]] alignas(32) float dd[8];
    if constexpr (decode4) scales_mins_k4x4<Block>(rows, i, sm16), d_dmin4<Block>(rows, i, a.x[0].d[i], dd);
    VLM_UNROLL
    for (int j = 0; j < S; ++j) {
      const auto* b = reinterpret_cast<const Block*>(rows[j]) + i;
      prefetch_ahead<S>(b, sizeof(Block));
      __m128i sm;
      __m256i mins;  // m_j for bsums 2j and 2j + 1
      if constexpr (decode4) {
        mins = _mm512_maskz_extracti64x4_epi64(0xF, _mm512_permutexvar_epi16(_mm512_load_si512(&kMinPairs[j % 2]), sm16[j / 2]), 0);
      } else {
        sm = scales_mins_k4(b->scales);
        mins = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm, pairs));
      }
      __m256i qh = _mm256_setzero_si256();
      if constexpr (five) qh = load32(b->qh);
      __m256i sum[RM];
      VLM_UNROLL
      for (int m = 0; m < RM; ++m) sum[m] = _mm256_setzero_si256();
      if constexpr (kZmm && RM == 1) {
        // Row j's eight scales as int16 in every 128-bit lane.
        __m512i scz;
        // The shuffle's selector must be a literal for clang (j is a loop variable).
        if constexpr (decode4)
          scz = j % 2 ? _mm512_maskz_shuffle_i32x4(0xFFFF, sm16[j / 2], sm16[j / 2], 0xAA)
                      : _mm512_maskz_shuffle_i32x4(0xFFFF, sm16[j / 2], sm16[j / 2], 0x00);
        else scz = _mm512_maskz_broadcast_i32x4(0xFFFF, _mm_cvtepu8_epi16(sm));
        const __m512i m4z = _mm512_set1_epi8(0x0F);
        // Q5_K: qh in both halves; sub-block k's fifth bits (bit k of each byte) rotate to bit 4 in
        // the half that holds k (a 64-bit rotate moves every byte's bit k alike).
        [[maybe_unused]] __m512i qhz;
        if constexpr (five) qhz = _mm512_maskz_broadcast_i64x4(0xFF, qh);
        auto codes = [&](__m512i nibbles, int h, int p) {
          if constexpr (!five) return nibbles;
          const int lo = 4 * p + h, hi = lo + 2;  // the sub-blocks in the two halves
          const __m512i turn = _mm512_setr_epi64((4 - lo) & 63, (4 - lo) & 63, (4 - lo) & 63, (4 - lo) & 63,
                                                 (4 - hi) & 63, (4 - hi) & 63, (4 - hi) & 63, (4 - hi) & 63);
          return _mm512_ternarylogic_epi32(nibbles, _mm512_maskz_rolv_epi64(0xFF, qhz, turn), _mm512_set1_epi8(0x10), 0xF8);
        };
        __m512i sumz = _mm512_setzero_si512();
        VLM_UNROLL
        for (int p = 0; p < 2; ++p) {
          const __m512i q = _mm512_loadu_si512(b->qs + 64 * p);
          add_scaled_pairs(sumz, codes(_mm512_and_si512(q, m4z), 0, p), xz[2 * p],
                           _mm512_shuffle_epi8(scz, _mm512_load_si512(&kPickK4[2 * p])));
          add_scaled_pairs(sumz, codes(_mm512_and_si512(_mm512_srli_epi16(q, 4), m4z), 1, p), xz[2 * p + 1],
                           _mm512_shuffle_epi8(scz, _mm512_load_si512(&kPickK4[2 * p + 1])));
        }
        sum[0] = fold_halves(sumz);
      } else if constexpr (kZmm && !five) {
        // Sub-blocks 2c (low nibbles) and 2c + 1 (high) side by side in one 512-bit register, as
        // their 64 activations lie in x: half the operations of the loop below, the same exact sums.
        // (Q5_K stays on that loop here: joining its two fifth-bit vectors cost more than it saved,
        // one thread from L2 0.097 against 0.081 ms for a 1024 × 2560 matrix, Emerald Rapids; at
        // M = 1 the branch above takes it.)
        const __m512i scz = _mm512_maskz_broadcast_i32x4(0xFFFF, _mm_cvtepu8_epi16(sm));
        __m512i sumz[RM];
        VLM_UNROLL
        for (int m = 0; m < RM; ++m) sumz[m] = _mm512_setzero_si512();
        VLM_UNROLL
        for (int c = 0; c < 4; ++c) {
          const __m256i q = load32(b->qs + 32 * c);
          // (The masked forms: GCC 12's unmasked broadcasts, inserts and shifts warn of an undefined
          // operand.) The high half shifted by 4 in 64-bit lanes: the bits that cross into a byte
          // are masked off.
          const __m512i qq = _mm512_maskz_broadcast_i64x4(0xFF, q);
          const __m512i codes = _mm512_and_si512(
              _mm512_maskz_srlv_epi64(0xFF, qq, _mm512_maskz_set1_epi64(0xF0, 4)), _mm512_set1_epi8(0x0F));
          const __m512i scale = _mm512_shuffle_epi8(scz, _mm512_load_si512(&kPickZ[c]));
          VLM_UNROLL
          for (int m = 0; m < RM; ++m) add_scaled_pairs(sumz[m], codes, a.x[m].q + 256 * i + 64 * size_t(c), scale);
        }
        VLM_UNROLL
        for (int m = 0; m < RM; ++m)
          sum[m] = fold_halves(sumz[m]);
      } else {
        const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
        VLM_UNROLL
        for (int c = 0; c < 4; ++c) {
          const __m256i q = load32(b->qs + 32 * c);
          __m256i codes[2] = {_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_srli_epi16(q, 4), m4)};
          if constexpr (five) {
            codes[0] = _mm256_or_si256(codes[0], move_bit(qh, 2 * c, 4));
            codes[1] = _mm256_or_si256(codes[1], move_bit(qh, 2 * c + 1, 4));
          }
          VLM_UNROLL
          for (int h = 0; h < 2; ++h) {
            const int k = 2 * c + h;
            const __m256i scale = shuffle(sc, kPick[k]);
            VLM_UNROLL
            for (int m = 0; m < RM; ++m) {
              const __m256i p = _mm256_maddubs_epi16(codes[h], load32(a.x[m].q + 256 * i + 32 * size_t(k)));
              sum[m] = _mm256_add_epi32(sum[m], _mm256_madd_epi16(p, scale));
              keep_chain(sum[m]);
            }
          }
        }
      }
      if constexpr (decode4) {
        finish_with_mins(acc[0][j], _mm256_broadcast_ss(dd + 2 * j), _mm256_broadcast_ss(dd + 2 * j + 1), a.x[0], i, sum[0],
                         mins);
      } else {
        const __m128 ddw = d_dmin(b);
        VLM_UNROLL
        for (int m = 0; m < RM; ++m) finish_with_mins(acc[m][j], ddw, a.x[m], i, sum[m], mins);
      }
    }
  }
  store_sums(acc, out);
}

// Q6_K against Q8_K activations: a 32-value chunk's unsigned codes q meet x as int16 pair sums
// (vpmaddubsw), and vpmaddwd multiplies them by the int8 scales of the chunk's two 16-value
// sub-blocks while it sums them in int32; the codes' offset, 32·Σ sc·x, is one vpmaddwd of the
// scales with the activation sums per 16 (bsums). The block stays one exact integer sum (at
// most 8·2·2·63·127·128 + 32·8·2·2032·128 per lane), finished by one conversion and one FMA.
template <int RM, int S>
QTARGET inline void dot_q6_k(const std::byte* const* rows, const Acts<RM, Q8KRow>& a, size_t nb, float* out) {
  __m256 acc[RM][S];
  zero_sums(acc);
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x30);
  for (size_t i = 0; i < nb; ++i) {
    VLM_UNROLL
    for (int j = 0; j < S; ++j) {
      const auto* b = reinterpret_cast<const BlockQ6_K*>(rows[j]) + i;
      prefetch_ahead<S>(b, sizeof(BlockQ6_K));
      const __m128i s8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b->scales));
      const __m256i all = _mm256_cvtepi8_epi16(s8);  // sub-block e/16's scale in lane e/16
      // A half's eight scales in each 128-bit lane: chunk k of the half (values 32k..32k+31) takes
      // scale 2k for its low lane (values 0-15) and 2k + 1 for its high lane.
      const __m256i sc[2] = {_mm256_permute4x64_epi64(all, 0x44), _mm256_permute4x64_epi64(all, 0xEE)};
      __m256i sum[RM];
      VLM_UNROLL
      for (int m = 0; m < RM; ++m)
        sum[m] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(load32(a.x[m].bsums + 16 * i), all), 5));
      if constexpr (kZmm) {
        // Chunks 0, 1 and then 2, 3 of a half side by side in 512-bit registers (their 64 low
        // code bytes are ql's 64 bytes, their activations contiguous in x), as in dot_k4.
        const __m512i m4z = _mm512_set1_epi8(0x0F), m2z = _mm512_set1_epi8(0x30);
        __m512i sumz[RM];
        VLM_UNROLL
        for (int m = 0; m < RM; ++m) sumz[m] = _mm512_setzero_si512();
        VLM_UNROLL
        for (int half = 0; half < 2; ++half) {
          const __m512i l = _mm512_loadu_si512(b->ql + 64 * half);
          const __m512i qh = _mm512_maskz_broadcast_i64x4(0xFF, load32(b->qh + 32 * half));
          // qh's bits for chunks 0 | 1 at bits 4-5 of each byte (shifted left by 4 | 2), for 2 | 3 (by 0 | right 2)
          const __m512i h01 = _mm512_mask_slli_epi16(_mm512_slli_epi16(qh, 4), 0xFFFF0000u, qh, 2);
          const __m512i h23 = _mm512_mask_srli_epi16(qh, 0xFFFF0000u, qh, 2);
          const __m512i codes[2] = {
              _mm512_or_si512(_mm512_and_si512(l, m4z), _mm512_and_si512(h01, m2z)),
              _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4z), _mm512_and_si512(h23, m2z)),
          };
          const __m512i scz = _mm512_maskz_broadcast_i64x4(0xFF, sc[half]);
          VLM_UNROLL
          for (int k = 0; k < 2; ++k) {
            const __m512i scale = _mm512_shuffle_epi8(scz, _mm512_load_si512(&kPickPairZ[k]));
            VLM_UNROLL
            for (int m = 0; m < RM; ++m)
              add_scaled_pairs(sumz[m], codes[k], a.x[m].q + 256 * i + 128 * size_t(half) + 64 * size_t(k), scale);
          }
        }
        VLM_UNROLL
        for (int m = 0; m < RM; ++m)
          sum[m] = _mm256_add_epi32(sum[m], fold_halves(sumz[m]));
      } else {
        VLM_UNROLL
        for (int half = 0; half < 2; ++half) {
          const __m256i l0 = load32(b->ql + 64 * half), l1 = load32(b->ql + 64 * half + 32);
          const __m256i qh = load32(b->qh + 32 * half);
          const __m256i codes[4] = {
              _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2)),
              _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2)),
              _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m2)),
              _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                              _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2)),
          };
          VLM_UNROLL
          for (int k = 0; k < 4; ++k) {
            const __m256i scale = shuffle(sc[half], kPickPair[k]);
            VLM_UNROLL
            for (int m = 0; m < RM; ++m) {
              const __m256i x = load32(a.x[m].q + 256 * i + 128 * size_t(half) + 32 * size_t(k));
              const __m256i p = _mm256_maddubs_epi16(codes[k], x);
              sum[m] = _mm256_add_epi32(sum[m], _mm256_madd_epi16(p, scale));
              keep_chain(sum[m]);
            }
          }
        }
      }
      const __m256 d = _mm256_set1_ps(f16(b->d));
      VLM_UNROLL
      for (int m = 0; m < RM; ++m) acc[m][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[m]), _mm256_mul_ps(d, bcast(a.x[m].d + i)), acc[m][j]);
    }
  }
  store_sums(acc, out);
}

// A Q3_K block's 16 six-bit sub-block scales less 32, as int16 in sub-block order (q3_k_scales
// in four 32-bit lanes: the low nibbles of bytes 0-3 and 4-7, then their high nibbles, each with
// its two top bits from bytes 8-11 shifted by 0, 2, 4, 6). Bytes 8-11 load on their own: a
// 16-byte load would run past the block, and past the tensor at its last block.
QTARGET inline __m256i q3_k_scales16(const uint8_t* s) {
  uint32_t top;
  std::memcpy(&top, s + 8, 4);
  const __m128i w = _mm_shuffle_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s)), _MM_SHUFFLE(1, 0, 1, 0));
  const __m128i low = _mm_and_si128(_mm_srlv_epi32(w, _mm_setr_epi32(0, 0, 4, 4)), _mm_set1_epi8(0x0F));
  const __m128i high = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32(int(top)), _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
  return _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_or_si128(low, _mm_slli_epi32(high, 4))), _mm256_set1_epi16(32));
}

// Of a 512-bit register holding a block's hmask twice: kHbitZ[k2] tests bit 2·k2 in the low 256 bits
// and bit 2·k2 + 1 in the high ones (chunks 2c, 2c + 1 of half h: k2 = 2h + c).
constexpr ShuffleBytes64 hbit_bytes(int p) {
  ShuffleBytes64 s{};
  for (int i = 0; i < 32; ++i) s.lo.b[i] = uint8_t(1 << p), s.hi.b[i] = uint8_t(1 << (p + 1));
  return s;
}
constexpr ShuffleBytes64 kHbitZ[4] = {hbit_bytes(0), hbit_bytes(2), hbit_bytes(4), hbit_bytes(6)};

// Q2_K and Q3_K against Q8_K activations, as Q6_K: a 32-value chunk k of half h (bits 2k of the
// half's 32 code bytes; Q3_K's third bit is bit 4h + k of hmask) meets x as int16 pair sums
// (vpmaddubsw), and vpmaddwd multiplies them by the scales of the chunk's two 16-value sub-blocks
// while it sums them in int32. Q2_K's mins meet the activation sums per 16 (bsums) in one more
// vpmaddwd; Q3_K's code offset, 4·Σ (sc − 32)·x, likewise. Exact integers (at most
// 16·7·127·32 + 4·16·2032·32 per lane).
template <class Block, int RM, int S>
QTARGET inline void dot_q23_k(const std::byte* const* rows, const Acts<RM, Q8KRow>& a, size_t nb, float* out) {
  constexpr bool three = std::is_same_v<Block, BlockQ3_K>;
  __m256 acc[RM][S];
  zero_sums(acc);
  const __m256i m2 = _mm256_set1_epi8(3);
  for (size_t i = 0; i < nb; ++i) {
    VLM_UNROLL
    for (int j = 0; j < S; ++j) {
      const auto* b = reinterpret_cast<const Block*>(rows[j]) + i;
      prefetch_ahead<S>(b, sizeof(Block));
      __m256i all, mins = _mm256_setzero_si256(), hm = _mm256_setzero_si256();  // sub-block e/16 in lane e/16
      if constexpr (three) {
        all = q3_k_scales16(b->scales);
        hm = load32(b->hmask);
      } else {
        const __m128i s8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b->scales));
        all = _mm256_cvtepu8_epi16(_mm_and_si128(s8, _mm_set1_epi8(0x0F)));
        mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), _mm_set1_epi8(0x0F)));
      }
      // A half's eight scales in each 128-bit lane (as dot_q6_k's)
      const __m256i sc[2] = {_mm256_permute4x64_epi64(all, 0x44), _mm256_permute4x64_epi64(all, 0xEE)};
      __m256i sum[RM];
      VLM_UNROLL
      for (int m = 0; m < RM; ++m) {
        sum[m] = _mm256_setzero_si256();
        if constexpr (three)
          sum[m] = _mm256_sub_epi32(sum[m], _mm256_slli_epi32(_mm256_madd_epi16(load32(a.x[m].bsums + 16 * i), all), 2));
      }
      if constexpr (kZmm) {
        // Chunks 2c and 2c + 1 of a half side by side in 512-bit registers (their activations
        // contiguous in x); Q3_K's third bits set where hmask has the chunk's bit (kHbitZ).
        const __m512i hz = _mm512_maskz_broadcast_i64x4(0xFF, hm);
        __m512i sumz[RM];
        VLM_UNROLL
        for (int m = 0; m < RM; ++m) sumz[m] = _mm512_setzero_si512();
        VLM_UNROLL
        for (int half = 0; half < 2; ++half) {
          const __m512i qq = _mm512_maskz_broadcast_i64x4(0xFF, load32(b->qs + 32 * half));
          const __m512i scz = _mm512_maskz_broadcast_i64x4(0xFF, sc[half]);
          VLM_UNROLL
          for (int c = 0; c < 2; ++c) {
            // One 64-bit variable shift: the low half by 4c, the high one by 4c + 2.
            const long long lo = 4 * c, hi = 4 * c + 2;
            __m512i codes = _mm512_and_si512(
                _mm512_maskz_srlv_epi64(0xFF, qq, _mm512_setr_epi64(lo, lo, lo, lo, hi, hi, hi, hi)), _mm512_set1_epi8(3));
            if constexpr (three)
              codes = _mm512_mask_add_epi8(codes, _mm512_test_epi8_mask(hz, _mm512_load_si512(&kHbitZ[2 * half + c])), codes,
                                           _mm512_set1_epi8(4));
            const __m512i scale = _mm512_shuffle_epi8(scz, _mm512_load_si512(&kPickPairZ[c]));
            VLM_UNROLL
            for (int m = 0; m < RM; ++m)
              add_scaled_pairs(sumz[m], codes, a.x[m].q + 256 * i + 128 * size_t(half) + 64 * size_t(c), scale);
          }
        }
        VLM_UNROLL
        for (int m = 0; m < RM; ++m) sum[m] = _mm256_add_epi32(sum[m], fold_halves(sumz[m]));
      } else {
        VLM_UNROLL
        for (int half = 0; half < 2; ++half) {
          const __m256i q = load32(b->qs + 32 * half);
          VLM_UNROLL
          for (int k = 0; k < 4; ++k) {
            __m256i codes = _mm256_and_si256(_mm256_srli_epi16(q, 2 * k), m2);
            if constexpr (three) codes = _mm256_or_si256(codes, move_bit(hm, 4 * half + k, 2));
            const __m256i scale = shuffle(sc[half], kPickPair[k]);
            VLM_UNROLL
            for (int m = 0; m < RM; ++m) {
              const __m256i x = load32(a.x[m].q + 256 * i + 128 * size_t(half) + 32 * size_t(k));
              sum[m] = _mm256_add_epi32(sum[m], _mm256_madd_epi16(_mm256_maddubs_epi16(codes, x), scale));
              keep_chain(sum[m]);
            }
          }
        }
      }
      if constexpr (three) {
        const __m256 d = _mm256_set1_ps(f16(b->d));
        VLM_UNROLL
        for (int m = 0; m < RM; ++m)
          acc[m][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[m]), _mm256_mul_ps(d, bcast(a.x[m].d + i)), acc[m][j]);
      } else {
        const __m128 ddw = d_dmin(b);
        VLM_UNROLL
        for (int m = 0; m < RM; ++m) finish_with_mins(acc[m][j], ddw, a.x[m], i, sum[m], mins);
      }
    }
  }
  store_sums(acc, out);
}

// IQ4_XS's eight signed sub-block scales ls − 32 as int16: the low four bits are nibble j % 2 of
// scales_l[j / 2] (byte j / 2 spread to lane j, the odd lanes shifted by 4), the top two bits 2j
// of scales_h (a multiply by 2^(14 − 2j) puts them at the top of lane j).
QTARGET inline __m128i iq4_xs_scales(const BlockIQ4_XS* b) {
  uint32_t l;
  std::memcpy(&l, b->scales_l, 4);
  const __m128i spread =
      _mm_shuffle_epi8(_mm_cvtsi32_si128(int(l)), _mm_setr_epi8(0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1));
  const __m128i low = _mm_and_si128(_mm_blend_epi16(spread, _mm_srli_epi16(spread, 4), 0xAA), _mm_set1_epi16(0x0F));
  const __m128i top = _mm_srli_epi16(
      _mm_mullo_epi16(_mm_set1_epi16(short(b->scales_h)), _mm_setr_epi16(1 << 14, 1 << 12, 1 << 10, 1 << 8, 1 << 6, 1 << 4, 1 << 2, 1)),
      14);
  return _mm_sub_epi16(_mm_or_si128(low, _mm_slli_epi16(top, 4)), _mm_set1_epi16(32));
}

// The IQ4 codebook's magnitudes: a code's value is negative exactly where its bit 3 is clear.
inline constexpr std::array<int8_t, 16> kIq4Magnitudes = [] {
  std::array<int8_t, 16> m{};
  for (int c = 0; c < 16; ++c) m[size_t(c)] = int8_t(kIq4Values[c] < 0 ? -kIq4Values[c] : kIq4Values[c]);
  return m;
}();

// IQ4_XS against Q8_K activations: a sub-block's codebook values w (signed bytes) meet x as int16
// pair sums of |w| and x with w's sign (vpmaddubsw), and vpmaddwd multiplies them by the
// sub-block's signed scale ls − 32 while it sums them in int32; the block stays one exact integer
// sum (at most 8·2·2·127·127·32 per lane), finished by one conversion and one FMA by d·d_x. On
// AVX512 (no 512-bit vpsignb) sub-blocks 2c and 2c + 1 share a register: |w| by a shuffle of the
// magnitudes, and x negated under the mask of codes below 8.
template <int RM, int S>
QTARGET inline void dot_iq4_xs(const std::byte* const* rows, const Acts<RM, Q8KRow>& a, size_t nb, float* out) {
  __m256 acc[RM][S];
  zero_sums(acc);
  for (size_t i = 0; i < nb; ++i) {
    VLM_UNROLL
    for (int j = 0; j < S; ++j) {
      const auto* b = reinterpret_cast<const BlockIQ4_XS*>(rows[j]) + i;
      prefetch_ahead<S>(b, sizeof(BlockIQ4_XS));
      const __m128i sc8 = iq4_xs_scales(b);
      const __m256i sc = _mm256_broadcastsi128_si256(sc8);
      __m256i sum[RM];
      VLM_UNROLL
      for (int m = 0; m < RM; ++m) sum[m] = _mm256_setzero_si256();
      if constexpr (kZmm) {
        const __m512i scz = _mm512_maskz_broadcast_i32x4(0xFFFF, sc8);
        const __m512i mag = _mm512_maskz_broadcast_i32x4(0xFFFF, _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4Magnitudes.data())));
        __m512i sumz[RM];
        VLM_UNROLL
        for (int m = 0; m < RM; ++m) sumz[m] = _mm512_setzero_si512();
        VLM_UNROLL
        for (int c = 0; c < 4; ++c) {
          // 128-bit lanes: sub-block 2c's bytes (low nibbles, then high), then sub-block 2c + 1's
          const __m512i qq = _mm512_maskz_broadcast_i64x4(0xFF, load32(b->qs + 32 * c));
          const __m512i q4 = _mm512_maskz_shuffle_i64x2(0xFF, qq, qq, _MM_SHUFFLE(1, 1, 0, 0));
          const __m512i codes = _mm512_and_si512(_mm512_mask_srli_epi16(q4, 0xFF00FF00u, q4, 4), _mm512_set1_epi8(0x0F));
          const __m512i w = _mm512_shuffle_epi8(mag, codes);
          const __mmask64 neg = _mm512_testn_epi8_mask(codes, _mm512_set1_epi8(8));
          const __m512i scale = _mm512_shuffle_epi8(scz, _mm512_load_si512(&kPickZ[c]));
          VLM_UNROLL
          for (int m = 0; m < RM; ++m) {
            const __m512i x = _mm512_loadu_si512(a.x[m].q + 256 * i + 64 * size_t(c));
            add_scaled_pairs(sumz[m], w, _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x), scale);
          }
        }
        VLM_UNROLL
        for (int m = 0; m < RM; ++m) sum[m] = fold_halves(sumz[m]);
      } else {
        VLM_UNROLL
        for (int k = 0; k < 8; ++k) {
          const __m256i w = iq4_values(nibbles32(b->qs + 16 * k)), aw = _mm256_sign_epi8(w, w);
          const __m256i scale = shuffle(sc, kPick[k]);
          VLM_UNROLL
          for (int m = 0; m < RM; ++m) {
            const __m256i xs = _mm256_sign_epi8(load32(a.x[m].q + 256 * i + 32 * size_t(k)), w);
            sum[m] = _mm256_add_epi32(sum[m], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xs), scale));
            keep_chain(sum[m]);
          }
        }
      }
      const __m256 d = _mm256_set1_ps(f16(b->d));
      VLM_UNROLL
      for (int m = 0; m < RM; ++m) acc[m][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[m]), _mm256_mul_ps(d, bcast(a.x[m].d + i)), acc[m][j]);
    }
  }
  store_sums(acc, out);
}

// The 256-value formats' kernel (Q8_K activations), RM activation rows against S weight rows.
template <GgmlType T, int RM, int S>
QTARGET inline void dot_k256(const std::byte* const* rows, const Acts<RM, Q8KRow>& a, size_t nb, float* out) {
  if constexpr (T == GgmlType::Q2_K) dot_q23_k<BlockQ2_K, RM, S>(rows, a, nb, out);
  else if constexpr (T == GgmlType::Q3_K) dot_q23_k<BlockQ3_K, RM, S>(rows, a, nb, out);
  else if constexpr (T == GgmlType::Q4_K) dot_k4<BlockQ4_K, RM, S>(rows, a, nb, out);
  else if constexpr (T == GgmlType::Q5_K) dot_k4<BlockQ5_K, RM, S>(rows, a, nb, out);
  else if constexpr (T == GgmlType::IQ4_XS) dot_iq4_xs<RM, S>(rows, a, nb, out);
  else dot_q6_k<RM, S>(rows, a, nb, out);
}

template <GgmlType T, int RM>
QTARGET inline void dot_block_rows(const std::byte* row, const Acts<RM, ActRow<T>>& x, size_t K, float* out) {
  if constexpr (!takes_q8k(T)) dot_block32<T, RM>(row, x, K / 32, out);
  else dot_k256<T, RM, 1>(&row, x, K / 256, out);
}

// Activation rows [m0, m0 + RM) against weight rows [n0, n1).
template <GgmlType T, int RM>
QTARGET void dot_rows(const GemmArgs& a, size_t m0, size_t n0, size_t n1) {
  Acts<RM, ActRow<T>> x;
  VLM_UNROLL
  for (int m = 0; m < RM; ++m) x.x[m] = act_row<T>(a.xq + (m0 + size_t(m)) * a.ldxq, a.K);
  const size_t group = m0 / 4 * (a.K / 32) * 4;  // m0 starts a group of four
  if (a.xd4) x.d4 = a.xd4 + group;
  if (a.xs4) x.s4 = a.xs4 + group;
  for (size_t n = n0; n < n1; ++n) {
    float v[RM];
    dot_block_rows<T, RM>(a.w + n * a.ldw_bytes, x, a.K, v);
    VLM_UNROLL
    for (int m = 0; m < RM; ++m) a.y[(m0 + size_t(m)) * a.ldy + n] = a.bias ? v[m] + a.bias[n] : v[m];
  }
}

// Q8_0 and IQ4_NL at M = 1: one activation row against S weight rows at once, each x block
// prepared once (XBlock) for all of them. (Its matrices stream at 81-88 % of the probe on Zen 5;
// taken two blocks at a time on AVX512 as the nibble formats are, they were no faster.)
template <GgmlType T, int S>
QTARGET inline void dot_signed_streams(const std::byte* const* rows, const Q8Row& x, size_t nb, float* out) {
  using Block = Block32<T>;
  __m256 acc[S][2];
  VLM_UNROLL
  for (int j = 0; j < S; ++j) acc[j][0] = acc[j][1] = _mm256_setzero_ps();
  auto block = [&](size_t i, int h) QTARGET {
    const XBlock xb(load32(x.q + 32 * i));
    const __m256 dx = bcast(x.d + i);
    VLM_UNROLL
    for (int j = 0; j < S; ++j) {
      const auto* b = reinterpret_cast<const Block*>(rows[j]) + i;
      const __m256 dw = bcast_f16(b->d);
      acc[j][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(xb.dot(weights32<T>(b))), _mm256_mul_ps(dw, dx), acc[j][h]);
    }
  };
  size_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    // Both lines the two blocks may touch: Q8_0's two are 68 bytes, and one line asked for per step
    // left every 17th line to a demand miss (a 40960 x 2560 matrix from memory, median 4.3-4.9
    // against 3.8-4.0 ms on an Emerald Rapids VM; docs/gguf.md, "Decode streams").
    VLM_UNROLL
    for (int j = 0; j < S; ++j) prefetch_ahead<S>(reinterpret_cast<const Block*>(rows[j]) + i, 2 * sizeof(Block));
    block(i, 0), block(i + 1, 1);
  }
  if (i < nb) block(i, 0);
  VLM_UNROLL
  for (int j = 0; j < S; ++j) out[j] = hsum(_mm256_add_ps(acc[j][0], acc[j][1]));
}

// One activation row against S weight rows in lockstep.
template <GgmlType T, int S>
QTARGET inline void dot_streams(const std::byte* const* rows, const ActRow<T>& x, size_t K, float* out) {
  if constexpr (kSignedWeights<T>) dot_signed_streams<T, S>(rows, x, K / 32, out);
  else if constexpr (!takes_q8k(T)) dot_nibble_streams<T, S>(rows, x, K / 32, out);
  else dot_k256<T, 1, S>(rows, Acts<1, Q8KRow>{{x}}, K / 256, out);
}

// M = 1: kStreams rows at a time, one from each of kStreams parts of the
// thread's range, so the thread reads that many sequential streams (as the bf16 dot does,
// matmul_avx512.cpp dot_bf16_row1; docs/gguf.md, "Decode streams").
template <GgmlType T>
QTARGET inline void dot_row1(const GemmArgs& a, size_t n0, size_t n1) {
  constexpr int kStreams = 4;
  const ActRow<T> x = act_row<T>(a.xq, a.K);
  auto store = [&](size_t n, float v) { a.y[n] = a.bias ? v + a.bias[n] : v; };
  const size_t part = (n1 - n0) / kStreams;
  for (size_t i = 0; i < part; ++i) {
    const std::byte* rows[kStreams];
    float v[kStreams];
    VLM_UNROLL
    for (int j = 0; j < kStreams; ++j) rows[j] = a.w + (n0 + size_t(j) * part + i) * a.ldw_bytes;
    dot_streams<T, kStreams>(rows, x, a.K, v);
    VLM_UNROLL
    for (int j = 0; j < kStreams; ++j) store(n0 + size_t(j) * part + i, v[j]);
  }
  for (size_t n = n0 + kStreams * part; n < n1; ++n) {
    const std::byte* row = a.w + n * a.ldw_bytes;
    float v;
    dot_streams<T, 1>(&row, x, a.K, &v);
    store(n, v);
  }
}

// y[m, n] for n in [n0, n1), every m, four activation rows at a time (the 256-value formats
// eight, and five to seven in one group: a block decoded once for eight rows; before Q6_K had lane
// tiles, its head of a 4B at M = 8 took 45-47 against 53-60 ms, its down matrices 54-55 against
// 75-87; a 10240 × 2560 Q6_K matrix at M = 6 1.6 against 2.6 ms); the weight rows are taken in slices that
// stay in L2 while every group of rows meets them.
template <GgmlType T>
QTARGET void quant_dot(const GemmArgs& a, size_t n0, size_t n1) {
  // Below kLaneFrom the row kernels take the rows in groups of up to four.
  static_assert(kLaneFrom<T> >= 2 && kLaneFrom<T> <= 5);
  if (a.M == 1) return dot_row1<T>(a, n0, n1);
  if (a.M >= kLaneFrom<T>) return dot_lanes<T>(a, n0, n1);
  const size_t slice = std::max<size_t>(1, (size_t(96) << 10) / std::max<size_t>(1, a.ldw_bytes));
  for (size_t s = n0; s < n1; s += slice) {
    const size_t e = std::min(n1, s + slice);
    size_t m = 0;
    for (; m + 4 <= a.M; m += 4) dot_rows<T, 4>(a, m, s, e);
    switch (a.M - m) {
      case 3: dot_rows<T, 3>(a, m, s, e); break;
      case 2: dot_rows<T, 2>(a, m, s, e); break;
      case 1: dot_rows<T, 1>(a, m, s, e); break;
      default: break;
    }
  }
}

// quantize_activations and quantize_activations_k (quant.h) eight values at a time, with the
// same f32 operations: the block maximum, d = amax/127 and 1/d in scalar, x·(1/d) per value,
// rounded half away from zero as std::round does (the truncation, plus the sign where the exact
// remainder is at least 1/2).
QTARGET inline float scale_of(const float* x, size_t n) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 mx = _mm256_setzero_ps();
  for (size_t i = 0; i < n; i += 8) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m))) / 127.0f;
}

QTARGET inline int hsum_epi32(__m256i v) {
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
  return _mm_cvtsi128_si32(t);
}

// The codes of 32 values at q (x·id rounded), and as int32 in qi.
QTARGET inline void round_codes(const float* x, float d, int8_t* q, __m256i (&qi)[4]) {
  const __m256 sign = _mm256_set1_ps(-0.0f), half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
  const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
  VLM_UNROLL
  for (int i = 0; i < 4; ++i) {
    const __m256 t = _mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), id), tr = _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 away = _mm256_and_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_sub_ps(t, tr)), half, _CMP_GE_OQ),
                                      _mm256_or_ps(one, _mm256_and_ps(sign, t)));
    qi[i] = _mm256_cvttps_epi32(_mm256_add_ps(tr, away));
  }
  // The packs interleave the 128-bit lanes: dwords (a0-3, b0-3, c0-3, d0-3 | a4-7, ...).
  const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

QTARGET void quantize_x(const float* x, std::byte* out, size_t K) {
  auto* q = reinterpret_cast<int8_t*>(out);
  auto* d = reinterpret_cast<float*>(out + K);
  for (size_t b = 0; b < K / 32; ++b, x += 32, q += 32) {
    d[b] = scale_of(x, 32);
    __m256i qi[4];
    round_codes(x, d[b], q, qi);
  }
}

QTARGET void quantize_xk(const float* x, std::byte* out, size_t K) {
  const size_t nb = K / 256;
  auto* q = reinterpret_cast<int8_t*>(out);
  auto* d = reinterpret_cast<float*>(out + K);
  auto* bsums = reinterpret_cast<int16_t*>(out + K + 4 * nb);
  for (size_t b = 0; b < nb; ++b, x += 256, q += 256, bsums += 16) {
    d[b] = scale_of(x, 256);
    for (int g = 0; g < 8; ++g) {
      __m256i qi[4];
      round_codes(x + 32 * g, d[b], q + 32 * g, qi);
      bsums[2 * g] = int16_t(hsum_epi32(_mm256_add_epi32(qi[0], qi[1])));
      bsums[2 * g + 1] = int16_t(hsum_epi32(_mm256_add_epi32(qi[2], qi[3])));
    }
  }
}

constexpr QuantKernels make_quant_kernels() {
  return {{&quant_dot<GgmlType::Q8_0>}, {&quant_dot<GgmlType::Q4_0>}, {&quant_dot<GgmlType::Q4_1>},
          {&quant_dot<GgmlType::Q5_0>}, {&quant_dot<GgmlType::Q5_1>}, {&quant_dot<GgmlType::Q2_K>},
          {&quant_dot<GgmlType::Q3_K>}, {&quant_dot<GgmlType::Q4_K>}, {&quant_dot<GgmlType::Q5_K>},
          {&quant_dot<GgmlType::Q6_K>}, {&quant_dot<GgmlType::IQ4_NL>}, {&quant_dot<GgmlType::IQ4_XS>},
          &quantize_x, &quantize_xk};
}

}  // namespace
}  // namespace vlm::kernels::detail
