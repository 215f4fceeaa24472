// AVX-512 (F/BW/VL/DQ) matmul kernels: 16 floats per vector, 6×64 register tiles; and the
// AVX512-BF16 path of Precision::Bf16 (vdpbf16ps on bf16 pairs): the GEMM and dot kernels for
// bf16 weights, and the GEMM for block-quantized weights dequantized into it.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/huge_pages.h"
#include "io/gguf.h"
#include "kernels/matmul_impl.h"
#include "kernels/ops.h"
#include "kernels/quant.h"
#include "kernels/quant_blocks.h"
#include "kernels/simd_avx512.h"

namespace vlm::kernels::detail {
namespace {

// bf16-dot blocking: K in pairs (one 32-bit word holds two bf16), so a K block of 256
// keeps the packed micro-panel (128 words × 64 columns) at 32 KiB, in L1, and kMCb rows of x
// (96 KiB of a K block) stay in L2 while every panel of a column block meets them.
constexpr size_t kKCb = 256, kMCb = 192, kNR = 64, kMR = 6;

// The tile GEMM's blocks (gemm_amx_with): kAmxNc columns × kAmxKc values of K packed at once (1 MiB,
// in L2), whose sums stay in the tiles from the block's first K value to its last.
constexpr size_t kAmxNc = 256, kAmxKc = 2048;

// How a panel of 64 columns × a K block lies: Rows, words [kc/2][64] (the dot GEMM's micro_bf16
// reads a pair row of 64 columns as four vectors); Tiles, the AMX B tiles whole, 1 KiB each (16
// pairs × 16 columns), a group of 16 columns' tiles one after another along K, kTileGroupWords
// apart, the last step zero past kc: a tile is one contiguous read (with rows 256 bytes apart the
// tiles' products ran at a third of their rate from L2; docs/gguf.md, "Prefill on AMX tiles").
enum class PanelLayout { Rows, Tiles };
constexpr size_t kTileGroupWords = kAmxKc / 2 * 16;

// Packs W(n0 .. n0+cols, k0 .. k0+kc) of a bf16 nk weight as `layout` says: word (p, j) holds
// W(n0+j, k0+2p) in its low half and W(n0+j, k0+2p+1) in its high half.
void pack_b_pairs(const GemmArgs& a, size_t n0, size_t cols, size_t k0, size_t kc, uint32_t* dst,
                  PanelLayout layout) {
  const size_t kp = (kc + 1) / 2;
  for (size_t g = 0; g < kNR; g += 16)
    for (size_t p = 0; p < kp; p += 16) {
      const size_t halves = kc - 2 * p < 32 ? kc - 2 * p : 32;
      __m512 blk[16];
      for (size_t i = 0; i < 16; ++i) {
        if (g + i >= cols) {
          blk[i] = _mm512_setzero_ps();
          continue;
        }
        const std::byte* src = a.w + (n0 + g + i) * a.ldw_bytes + (k0 + 2 * p) * 2;
        if (halves == 32) {
          blk[i] = _mm512_loadu_ps(reinterpret_cast<const float*>(src));
        } else {
          alignas(64) std::byte tmp[64] = {};
          std::memcpy(tmp, src, halves * 2);
          blk[i] = _mm512_load_ps(reinterpret_cast<const float*>(tmp));
        }
      }
      S512::transpose(blk);  // 32-bit words: rows of W become columns; past kc zero
      if (layout == PanelLayout::Tiles) {
        for (size_t i = 0; i < 16; ++i)
          _mm512_store_ps(reinterpret_cast<float*>(dst + g / 16 * kTileGroupWords + (p + i) * 16), blk[i]);
        continue;
      }
      const size_t np = kp - p < 16 ? kp - p : 16;
      for (size_t i = 0; i < np; ++i) _mm512_storeu_ps(reinterpret_cast<float*>(dst + (p + i) * kNR + g), blk[i]);
    }
}

// The FMA twins of the bf16 dot kernels (CPUs whose vdpbf16ps does fewer products per cycle;
// docs/gguf.md, "Which kernels a bf16 product takes") widen 32-bit words of two bf16 values
// exactly: the low value shifted into the high half, the high one with the low half masked.
inline __m512 bf16_low(__m512i w) { return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)); }
inline __m512 bf16_high(__m512i w) {
  return _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(int32_t(0xFFFF0000u))));
}

// R rows of A (words [kp] each, lda apart; a word is a bf16 pair) × up to 64 columns of B
// (words [kp][ldb]).
template <int R, int NVv>
void micro_bf16(size_t kp, const uint32_t* A, size_t lda, const uint32_t* B, size_t ldb, float* y, size_t ldy,
                size_t cols, bool first, const float* bias) {
  __m512 acc[R][NVv];
  VLM_UNROLL
  for (int r = 0; r < R; ++r) {
    VLM_UNROLL
    for (int v = 0; v < NVv; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  for (size_t p = 0; p < kp; ++p) {
    __m512i bw[NVv];
    VLM_UNROLL
    for (int v = 0; v < NVv; ++v) bw[v] = _mm512_loadu_si512(B + p * ldb + v * 16);
    VLM_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m512i x = _mm512_set1_epi32(int(A[r * lda + p]));
      const __m512bh av = reinterpret_cast<const __m512bh&>(x);
      VLM_UNROLL
      for (int v = 0; v < NVv; ++v)
        acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, reinterpret_cast<const __m512bh&>(bw[v]));
    }
  }
  store_tile<S512, R, NVv>(acc, y, ldy, cols, first, bias);
}

using MicroBf16 = void (*)(size_t, const uint32_t*, size_t, const uint32_t*, size_t, float*, size_t, size_t,
                           bool, const float*);

template <int R, size_t... V>
constexpr void fill_row_bf16(MicroBf16* row, std::index_sequence<V...>) {
  ((row[V] = &micro_bf16<R, int(V) + 1>), ...);
}
template <size_t... R>
constexpr void fill_table_bf16(MicroBf16 (*t)[4], std::index_sequence<R...>) {
  (fill_row_bf16<int(R) + 1>(t[R], std::make_index_sequence<4>()), ...);
}

// micro_bf16 for r rows and v vectors of columns: micro_table().f[r - 1][v - 1].
struct MicroTable {
  MicroBf16 f[kMR][4];
};
const MicroTable& micro_table() {
  static const MicroTable table = [] {
    MicroTable m{};
    fill_table_bf16(m.f, std::make_index_sequence<kMR>());
    return m;
  }();
  return table;
}

// pack_b(n0, cols, k0, kc, dst) packs W(n0 .. n0+cols, k0 .. k0+kc) as pack_b_pairs does (Rows).
template <class PackB>
void gemm_bf16dot_with(const GemmArgs& a, size_t nb, size_t ne, size_t mb, size_t me, float* pack, PackB&& pack_b) {
  const MicroTable& table = micro_table();
  auto* bpack = reinterpret_cast<uint32_t*>(pack);  // kNC × kKCb/2 words
  static_assert(kNC * (kKCb / 2) <= 2 * kNC * kKC, "pack buffer too small");
  // x is already bf16 (a.xq, matmul.cpp bf16_x): its rows are the A operand as they are, a
  // word per pair.
  const auto* xq = reinterpret_cast<const uint32_t*>(a.xq);
  const size_t lda = a.ldxq / 4;
  constexpr size_t panel_words = kKCb / 2 * kNR;
  const size_t step = column_block(ne - nb, kNR);
  for (size_t n0 = nb; n0 < ne; n0 += step) {
    const size_t nc = ne - n0 < step ? ne - n0 : step;
    const size_t panels = (nc + kNR - 1) / kNR;
    for (size_t k0 = 0; k0 < a.K; k0 += kKCb) {
      const size_t kc = a.K - k0 < kKCb ? a.K - k0 : kKCb, kp = (kc + 1) / 2;
      for (size_t p = 0; p < panels; ++p) {
        const size_t c = nc - p * kNR < kNR ? nc - p * kNR : kNR;
        pack_b(n0 + p * kNR, c, k0, kc, bpack + p * panel_words);
      }
      const float* bias = a.bias ? a.bias + n0 : nullptr;
      for (size_t m0 = mb; m0 < me; m0 += kMCb) {
        const size_t m1 = me - m0 < kMCb ? me : m0 + kMCb;
        for (size_t p = 0; p < panels; ++p) {
          const size_t c = nc - p * kNR < kNR ? nc - p * kNR : kNR;
          const size_t nv = (c + 15) / 16;
          for (size_t m = m0; m < m1; m += kMR) {
            const size_t r = m1 - m < kMR ? m1 - m : kMR;
            table.f[r - 1][nv - 1](kp, xq + m * lda + k0 / 2, lda, bpack + p * panel_words, kNR,
                                   a.y + m * a.ldy + n0 + p * kNR, a.ldy, c, k0 == 0,
                                   bias ? bias + p * kNR : nullptr);
          }
        }
      }
    }
  }
}

void gemm_bf16dot(const GemmArgs& a, size_t nb, size_t ne, size_t mb, size_t me, float* pack) {
  gemm_bf16dot_with(a, nb, ne, mb, me, pack, [&](size_t n0, size_t cols, size_t k0, size_t kc, uint32_t* dst) {
    pack_b_pairs(a, n0, cols, k0, kc, dst, PanelLayout::Rows);
  });
}

// Helpers of dequantize_blocks_avx512. mul_exact's _round form keeps a product from being
// fused with the difference that follows it (dequantize_row rounds both).
inline __m512 u8x16_to_ps(__m128i b) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)); }
inline __m512 mul_exact(__m512 a, __m512 b) { return _mm512_mul_round_ps(a, b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline __m128i load16(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

// ---- small M on the bf16 dot: x as bf16 words (a.xq, rows padded with zeros to whole
// vectors), 32 products per vdpbf16ps, so a decode step does half the instructions per
// weight byte of the widening FMA path and the x row of K = 10240 (20 KiB) stays in L1.

// The bf16 values [lo, hi) of the 32 at p, the rest zero (a masked load reads nothing
// outside them).
inline __m512bh load_bf16_range(const std::byte* p, size_t lo, size_t hi) {
  const uint32_t m = uint32_t((uint64_t(1) << hi) - 1) & ~uint32_t((uint64_t(1) << lo) - 1);
  const __m512i v = _mm512_maskz_loadu_epi16(__mmask32(m), p);
  return reinterpret_cast<const __m512bh&>(v);
}
inline __m512bh load_bf16x32(const std::byte* p) {
  const __m512i v = _mm512_loadu_si512(p);
  return reinterpret_cast<const __m512bh&>(v);
}

// The rest of row wr's dot product with x from column k on, given its two partial sums.
inline float finish_row(const GemmArgs& a, const std::byte* wr, size_t k, __m512 c0, __m512 c1) {
  for (; k + 32 <= a.K; k += 32) c0 = _mm512_dpbf16_ps(c0, load_bf16x32(a.xq + 2 * k), load_bf16x32(wr + 2 * k));
  if (k < a.K) c1 = _mm512_dpbf16_ps(c1, load_bf16_range(a.xq + 2 * k, 0, a.K - k), load_bf16_range(wr + 2 * k, 0, a.K - k));
  return _mm512_reduce_add_ps(_mm512_add_ps(c0, c1));
}

// The values of each weight row before its first 64-byte boundary (0 when rows differ in
// alignment). dot_bf16_row1 takes them apart so that every later load of a row is one cache
// line; bf16_x (matmul.cpp) places x at the weights' offset in a line, so x's loads are too.
// Safetensors tensors sit at any offset, and loads split across two lines took 13 % off the
// stream (48.5 against 55.4 GB/s, measured).
inline size_t aligning_lead(const GemmArgs& a) {
  if (a.ldw_bytes % 64) return 0;
  return std::min(a.K, (64 - (reinterpret_cast<uintptr_t>(a.w) & 63)) % 64 / 2);
}

// Rows n0 + j · part + i of R streams (the tail of a range: R = 1); a row's sums do not depend on
// R, as in dot_row1_streams (matmul_impl.h).
template <int R>
void dot_bf16_row1_streams(const GemmArgs& a, size_t n0, size_t part, size_t i, size_t lead) {
  const std::byte* w[R];
  __m512 c[2][R];
  VLM_UNROLL
  for (int j = 0; j < R; ++j) {
    w[j] = a.w + (n0 + j * part + i) * a.ldw_bytes;
    c[0][j] = c[1][j] = _mm512_setzero_ps();
    if (lead) c[1][j] = _mm512_dpbf16_ps(c[1][j], load_bf16_range(a.xq, 0, lead), load_bf16_range(w[j], 0, lead));
  }
  size_t k = lead;
  for (; k + 64 <= a.K; k += 64) {
    VLM_UNROLL
    for (int j = 0; j < R; ++j)
      for (int h = 0; h < 2; ++h) _mm_prefetch(reinterpret_cast<const char*>(w[j] + 2 * k + 64 * h + kRowAhead), _MM_HINT_T0);
    VLM_UNROLL
    for (int h = 0; h < 2; ++h) {  // each x vector against every stream, then the next
      const __m512bh xv = load_bf16x32(a.xq + 2 * k + 64 * h);
      VLM_UNROLL
      for (int j = 0; j < R; ++j) c[h][j] = _mm512_dpbf16_ps(c[h][j], xv, load_bf16x32(w[j] + 2 * k + 64 * h));
    }
  }
  VLM_UNROLL
  for (int j = 0; j < R; ++j) {
    const size_t n = n0 + j * part + i;
    a.y[n] = finish_row(a, w[j], k, c[0][j], c[1][j]) + (a.bias ? a.bias[n] : 0.f);
  }
}

// M = 1: kStreams rows at a time, one from each of kStreams equal parts of the range, so a
// thread keeps that many sequential streams in flight (with one, the step reached 52–61 % of
// the bandwidth probe; with four 74–86 %; docs/gguf.md, "Decode streams"), each asked for
// kRowAhead bytes ahead. Each x vector is loaded once for all of them.
constexpr int kStreams = 4;
void dot_bf16_row1(const GemmArgs& a, size_t n0, size_t n1) {
  const size_t part = (n1 - n0) / kStreams, lead = aligning_lead(a);
  for (size_t i = 0; i < part; ++i) dot_bf16_row1_streams<kStreams>(a, n0, part, i, lead);
  for (size_t n = n0 + kStreams * part; n < n1; ++n) dot_bf16_row1_streams<1>(a, n, 0, 0, lead);
}

// RM activation rows from m0 × the RN weight rows at wr over columns [k0, k1) of K, each
// weight vector meeting every row. Columns count from the 64-byte line that holds each weight
// row's first value, `shift` values before it (fma_dot_shift), so that every full load is one
// line; the first and last loads leave out the words outside the row. The sums start at zero
// when k0 = 0, else from acc[RM][RN]; they go back to acc unless k1 = K, where they become y's
// entries for rows n0 + r · stride. Wide: the same products on the f32 FMAs (Exec::bf16_gemm not
// Dot: CPUs whose vdpbf16ps does fewer products per cycle), x as f32 in a.xq with the shift's
// zeros before each row (wide_x in matmul.cpp); a weight vector widens into its even entries
// (bf16_low) and odd ones. Else x as bf16 in a.xq (bf16_x), its rows at the weights' offset in a
// line.
template <bool Wide, int RM, int RN>
void dot_bf16_tile(const GemmArgs& a, size_t m0, const std::byte* const* wr, size_t n0, size_t stride, size_t k0,
                   size_t k1, size_t K, size_t shift, __m512* acc_mem) {
  __m512 acc[RM][RN];
  tile_start<S512>(acc, k0, acc_mem);
  auto step = [&](size_t k, auto load_w, auto load_x) {
    __m512bh wv[RN];
    VLM_UNROLL
    for (int r = 0; r < RN; ++r) wv[r] = load_w(wr[r] + 2 * k);
    if constexpr (Wide) {
      __m512 we[RN], wo[RN];
      VLM_UNROLL
      for (int r = 0; r < RN; ++r) {
        const __m512i w = reinterpret_cast<const __m512i&>(wv[r]);
        we[r] = bf16_low(w), wo[r] = bf16_high(w);
      }
      VLM_UNROLL
      for (int m = 0; m < RM; ++m) {
        const float* x = reinterpret_cast<const float*>(a.xq + (m0 + m) * a.ldxq) + k;
        const __m512 xe = _mm512_load_ps(x), xo = _mm512_load_ps(x + 16);
        VLM_UNROLL
        for (int r = 0; r < RN; ++r) acc[m][r] = _mm512_fmadd_ps(xo, wo[r], _mm512_fmadd_ps(xe, we[r], acc[m][r]));
      }
    } else {
      VLM_UNROLL
      for (int m = 0; m < RM; ++m) {
        const __m512bh xv = load_x(a.xq + (m0 + m) * a.ldxq - 2 * shift + 2 * k);
        VLM_UNROLL
        for (int r = 0; r < RN; ++r) acc[m][r] = _mm512_dpbf16_ps(acc[m][r], xv, wv[r]);
      }
    }
  };
  auto part = [](size_t lo, size_t hi) { return [=](const std::byte* p) { return load_bf16_range(p, lo, hi); }; };
  size_t k = k0;
  if (k == 0 && shift)  // the head of group 0 is not the row's
    step(k, part(shift, std::min<size_t>(32, k1)), part(shift, std::min<size_t>(32, k1))), k = 32;
  for (; k + 32 <= k1; k += 32)
    step(k, [&](const std::byte* p) {
      __builtin_prefetch(p + kRowAhead, 0, 3);  // RN streams far apart: see dot_tile
      return load_bf16x32(p);
    }, [](const std::byte* p) { return load_bf16x32(p); });
  if (k < k1) step(k, part(0, k1 - k), part(0, k1 - k));
  tile_finish<S512>(a, acc, k1, K, acc_mem, m0, n0, stride);
}

// Columns per pass when more than four activation rows meet the same weight rows: the
// weights' piece (RN · 1 KiB) and the rows' (1 KiB a row: at 64 rows partly in L2) stay in L1
// while every group of four rows meets them. Sweeping whole rows instead, the second group read them
// back from L2 and the step took 1.5× as long at M = 8 as at M = 4 (the weights' read alone sets both).
// Wide rows are f32, twice the bytes per value.
template <bool Wide>
constexpr size_t kDotBlock = Wide ? 256 : 512;

// Every activation row × the RN weight rows n0, n0 + stride, …
template <bool Wide, int RN>
void dot_bf16_rows(const GemmArgs& a, size_t n0, size_t stride) {
  alignas(64) __m512 acc[kBf16DotRows / 4][4 * RN];  // the sums of each group between column blocks
  const size_t shift = fma_dot_shift(a), K = a.K + shift;
  const std::byte* wr[RN];
  VLM_UNROLL
  for (int r = 0; r < RN; ++r) wr[r] = a.w + (n0 + r * stride) * a.ldw_bytes - 2 * shift;
  const size_t block = a.M <= 4 ? K : kDotBlock<Wide>;
  // Three rows left over go as a group of four whose last row is bf16_x's zero padding (tile_finish
  // writes no sums for it): the three-row tile took 1.3x the four-row one's time for the same
  // weights (docs/performance.md, "drafts by prompt lookup").
  const size_t M = !Wide && a.M % 4 == 3 ? a.M + 1 : a.M;
  for (size_t k0 = 0; k0 < K; k0 += block) {
    const size_t k1 = std::min(K, k0 + block);
    row_groups(M, [&](auto rm, size_t m) {
      dot_bf16_tile<Wide, rm, RN>(a, m, wr, n0, stride, k0, k1, K, shift, acc[m / 4]);
    });
  }
}

// M = 2..kBf16DotRows: kStreams weight rows at a time, one from each of kStreams parts of the range
// (kStreams streams per thread, as at M = 1: batched decode ×8 +11 %).
template <bool Wide>
void dot_bf16_streams(const GemmArgs& a, size_t n0, size_t n1) {
  const size_t part = (n1 - n0) / kStreams;
  for (size_t i = 0; i < part; ++i) dot_bf16_rows<Wide, kStreams>(a, n0 + i, part);
  for (size_t n = n0 + kStreams * part; n < n1; ++n) dot_bf16_rows<Wide, 1>(a, n, 1);
}

void dot_bf16dot(const GemmArgs& a, size_t n0, size_t n1) {
  if (a.M == 1) return dot_bf16_row1(a, n0, n1);
  dot_bf16_streams<false>(a, n0, n1);
}

void dot_bf16_fma(const GemmArgs& a, size_t n0, size_t n1) { dot_bf16_streams<true>(a, n0, n1); }

// Q4_K and Q5_K blocks for dequantize_blocks_avx512: value l of sub-block j is d·sc_j·q − dmin·m_j,
// Q5_K's code taking bit j of qh[l] as its fifth bit.
template <class Block>
void dequantize_k4_avx512(const std::byte* src, float* y, size_t n) {
  using namespace quant_blocks;
  const __m128i m4 = _mm_set1_epi8(0x0F), one = _mm_set1_epi8(1);
  for (const auto* b = reinterpret_cast<const Block*>(src); n; n -= 256, ++b) {
    const float d = _cvtsh_ss(b->d), dmin = _cvtsh_ss(b->dmin);
    for (int j = 0; j < 8; j += 2) {
      uint8_t sc, m;
      scale_min_k4(j, b->scales, sc, m);
      const __m512 d1 = _mm512_set1_ps(d * float(sc)), m1 = _mm512_set1_ps(dmin * float(m));
      scale_min_k4(j + 1, b->scales, sc, m);
      const __m512 d2 = _mm512_set1_ps(d * float(sc)), m2 = _mm512_set1_ps(dmin * float(m));
      for (int h = 0; h < 2; ++h) {  // low nibbles are values 0..31 of the pair, high 32..63
        const __m128i q = load16(b->qs + 16 * j + 16 * h);
        __m128i lo = _mm_and_si128(q, m4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
        if constexpr (std::is_same_v<Block, BlockQ5_K>) {  // 16-bit shifts: bit j stays in its byte
          const __m128i qh = load16(b->qh + 16 * h);
          lo = _mm_or_si128(lo, _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(qh, j), one), 4));
          hi = _mm_or_si128(hi, _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(qh, j + 1), one), 4));
        }
        _mm512_storeu_ps(y + 16 * h, _mm512_sub_ps(mul_exact(d1, u8x16_to_ps(lo)), m1));
        _mm512_storeu_ps(y + 32 + 16 * h, _mm512_sub_ps(mul_exact(d2, u8x16_to_ps(hi)), m2));
      }
      y += 64;
    }
  }
}

// Q4_1, Q5_0 and Q5_1 blocks for dequantize_blocks_avx512 (Gemma 3 1B's Q4_K_M and Q5_K_M files
// hold Q5_0 / Q5_1 in most matrices): the nibbles as Q4_0's, plus 16 where bit j of qh is set;
// Q5_0: (q − 16)·d, the others q·d + m.
template <class Block>
void dequantize_q45_avx512(const std::byte* src, float* y, size_t n) {
  constexpr bool fifth = requires(Block b) { b.qh; }, offset = std::is_same_v<Block, quant_blocks::BlockQ5_0>;
  const __m128i m4 = _mm_set1_epi8(0x0F);
  for (const auto* b = reinterpret_cast<const Block*>(src); n; n -= 32, ++b, y += 32) {
    const __m512 d = _mm512_set1_ps(_cvtsh_ss(b->d));
    const __m128i q = load16(b->qs);
    uint32_t qh = 0;
    if constexpr (fifth) std::memcpy(&qh, b->qh, 4);
    for (int h = 0; h < 2; ++h) {
      __m512i v = _mm512_cvtepu8_epi32(_mm_and_si128(h ? _mm_srli_epi16(q, 4) : q, m4));
      if constexpr (fifth) v = _mm512_mask_add_epi32(v, __mmask16(qh >> 16 * h), v, _mm512_set1_epi32(16));
      const __m512 f = _mm512_cvtepi32_ps(v);
      // float(code − 16): the difference of small integers is exact in f32 too
      if constexpr (offset) _mm512_storeu_ps(y + 16 * h, mul_exact(_mm512_sub_ps(f, _mm512_set1_ps(16.f)), d));
      else _mm512_storeu_ps(y + 16 * h, _mm512_add_ps(mul_exact(f, d), _mm512_set1_ps(_cvtsh_ss(b->m))));
    }
  }
}

// 32 IQ4 values (16 bytes of nibbles, as Q4_0's) for dequantize_blocks_avx512: dl·kv[code].
inline void iq4_values16x2(const uint8_t* qs, __m512 dl, float* y) {
  const __m128i table = load16(quant_blocks::kIq4Values), q = load16(qs), m4 = _mm_set1_epi8(0x0F);
  for (int h = 0; h < 2; ++h) {
    const __m128i codes = _mm_and_si128(h ? _mm_srli_epi16(q, 4) : q, m4);
    _mm512_storeu_ps(y + 16 * h, mul_exact(dl, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_shuffle_epi8(table, codes)))));
  }
}

// Q2_K and Q3_K blocks for dequantize_blocks_avx512, one 16-value sub-block j at a time: its two low
// code bits are bits 2k of 16 bytes of the half's 32 (k = j % 8 / 2), Q3_K's third bit is bit
// j / 2 of hmask's same 16 bytes. Q2_K: d·sc·q − dmin·m; Q3_K: d·(sc − 32)·(q − 4).
template <class Block>
void dequantize_q23_avx512(const std::byte* src, float* y, size_t n) {
  using namespace quant_blocks;
  constexpr bool three = std::is_same_v<Block, BlockQ3_K>;
  const __m128i m2 = _mm_set1_epi8(3), one = _mm_set1_epi8(1);
  for (const auto* b = reinterpret_cast<const Block*>(src); n; n -= 256, ++b) {
    const float d = _cvtsh_ss(b->d);
    uint8_t sc[16];
    if constexpr (three) q3_k_scales(b->scales, sc);
    for (int j = 0; j < 16; ++j, y += 16) {
      const int half = j / 8, k = j % 8 / 2, l0 = 16 * (j % 2);
      __m128i q = _mm_and_si128(_mm_srli_epi16(load16(b->qs + 32 * half + l0), 2 * k), m2);
      if constexpr (three) {
        q = _mm_or_si128(q, _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(load16(b->hmask + l0), j / 2), one), 2));
        const __m512 dl = _mm512_set1_ps(d * float(sc[j] - 32));
        // float(code − 4): the difference of small integers is exact in f32 too
        _mm512_storeu_ps(y, mul_exact(dl, _mm512_sub_ps(u8x16_to_ps(q), _mm512_set1_ps(4.f))));
      } else {
        const __m512 dl = _mm512_set1_ps(d * float(b->scales[j] & 0xF));
        const __m512 ml = _mm512_set1_ps(_cvtsh_ss(b->dmin) * float(b->scales[j] >> 4));
        _mm512_storeu_ps(y, _mm512_sub_ps(mul_exact(dl, u8x16_to_ps(q)), ml));
      }
    }
  }
}

}  // namespace

// dequantize_row's values with the same f32 operations (exact int → f32 conversions, the
// same products and differences in the same order), 16 at a time. n is whole blocks.
void dequantize_blocks_avx512(GgmlType t, const std::byte* src, float* y, size_t n) {
  using namespace quant_blocks;
  const __m128i m4 = _mm_set1_epi8(0x0F);
  switch (t) {
    case GgmlType::Q8_0:
      for (const auto* b = reinterpret_cast<const BlockQ8_0*>(src); n; n -= 32, ++b, y += 32) {
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(b->d));
        for (int h = 0; h < 2; ++h)
          _mm512_storeu_ps(y + 16 * h, mul_exact(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16(b->qs + 16 * h))), d));
      }
      return;
    case GgmlType::Q4_0:
      for (const auto* b = reinterpret_cast<const BlockQ4_0*>(src); n; n -= 32, ++b, y += 32) {
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(b->d)), eight = _mm512_set1_ps(8.f);
        const __m128i q = load16(b->qs);
        // float(code − 8): the difference of small integers is exact in f32 too
        _mm512_storeu_ps(y, mul_exact(_mm512_sub_ps(u8x16_to_ps(_mm_and_si128(q, m4)), eight), d));
        _mm512_storeu_ps(y + 16, mul_exact(_mm512_sub_ps(u8x16_to_ps(_mm_and_si128(_mm_srli_epi16(q, 4), m4)), eight), d));
      }
      return;
    case GgmlType::Q4_1: return dequantize_q45_avx512<BlockQ4_1>(src, y, n);
    case GgmlType::Q5_0: return dequantize_q45_avx512<BlockQ5_0>(src, y, n);
    case GgmlType::Q5_1: return dequantize_q45_avx512<BlockQ5_1>(src, y, n);
    case GgmlType::IQ4_NL:
      for (const auto* b = reinterpret_cast<const BlockIQ4_NL*>(src); n; n -= 32, ++b, y += 32)
        iq4_values16x2(b->qs, _mm512_set1_ps(_cvtsh_ss(b->d)), y);
      return;
    case GgmlType::IQ4_XS:
      for (const auto* b = reinterpret_cast<const BlockIQ4_XS*>(src); n; n -= 256, ++b) {
        const float d = _cvtsh_ss(b->d);
        for (int j = 0; j < 8; ++j, y += 32) iq4_values16x2(b->qs + 16 * j, _mm512_set1_ps(d * float(iq4_xs_scale(b, j))), y);
      }
      return;
    case GgmlType::Q2_K: return dequantize_q23_avx512<BlockQ2_K>(src, y, n);
    case GgmlType::Q3_K: return dequantize_q23_avx512<BlockQ3_K>(src, y, n);
    case GgmlType::Q4_K: return dequantize_k4_avx512<BlockQ4_K>(src, y, n);
    case GgmlType::Q5_K: return dequantize_k4_avx512<BlockQ5_K>(src, y, n);
    case GgmlType::Q6_K:
      for (const auto* b = reinterpret_cast<const BlockQ6_K*>(src); n; n -= 256, ++b) {
        const float d = _cvtsh_ss(b->d);
        const __m512i k32 = _mm512_set1_epi32(32), m4d = _mm512_set1_epi32(0x0F), m3 = _mm512_set1_epi32(3);
        for (int half = 0; half < 2; ++half, y += 128) {
          const uint8_t* ql = b->ql + 64 * half;
          const uint8_t* qh = b->qh + 32 * half;
          const int8_t* sc = b->scales + 8 * half;
          for (int g = 0; g < 2; ++g) {  // l = 16g .. 16g + 15, sub-block is = g
            const __m512i lo = _mm512_cvtepu8_epi32(load16(ql + 16 * g));
            const __m512i hi = _mm512_cvtepu8_epi32(load16(ql + 32 + 16 * g));
            const __m512i qhv = _mm512_cvtepu8_epi32(load16(qh + 16 * g));
            const __m512i q[4] = {
                _mm512_or_si512(_mm512_and_si512(lo, m4d), _mm512_slli_epi32(_mm512_and_si512(qhv, m3), 4)),
                _mm512_or_si512(_mm512_and_si512(hi, m4d),
                                _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(qhv, 2), m3), 4)),
                _mm512_or_si512(_mm512_srli_epi32(lo, 4),
                                _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(qhv, 4), m3), 4)),
                _mm512_or_si512(_mm512_srli_epi32(hi, 4), _mm512_slli_epi32(_mm512_srli_epi32(qhv, 6), 4)),
            };
            for (int r = 0; r < 4; ++r) {  // y[l + 32r] = d·sc[is + 2r]·(q − 32), left to right
              const __m512 ds = _mm512_set1_ps(d * float(sc[g + 2 * r]));
              _mm512_storeu_ps(y + 32 * r + 16 * g, mul_exact(ds, _mm512_cvtepi32_ps(_mm512_sub_epi32(q[r], k32))));
            }
          }
        }
      }
      return;
    default:
      fail("matmul: {} is not a block format", ggml_type_name(t));
  }
}

// Block-quantized weights on the bf16 GEMMs: each row's K block (kKCb = 256 values, whole
// blocks of every format) is dequantized exactly (dequantize_blocks_avx512) and rounded to bf16
// (nearest even) into a dense [kNR][kKCb] scratch, which is then packed like bf16 weights.
// The dequantization is paid once per weight value and call, against M products. f16 weights
// whose values are bf16 values (GemmArgs::bf16_exact) take the same way, widened instead, and the
// rounding leaves them as they are (docs/gguf.md, "f16 weights that are bf16 values").
namespace {
// Rows of W over [k0, k0 + kc) dequantized exactly (block formats) or widened (f16), then rounded
// to bf16 (nearest even), zero past kc up to whole groups of 32; tmp holds kKCb floats. The
// format's traits are looked up once here, not per row (that cost a Q8_0 prefill 17 %).
class RowRounder {
 public:
  explicit RowRounder(const GemmArgs& a) : a_(a) {
    static_assert(kKCb % 256 == 0, "K blocks must hold whole blocks of every format");
    if (a.dtype != DType::F16) {
      t_ = ggml_type_of(a.dtype);
      block_ = size_t(ggml_traits(t_).block_elems), block_bytes_ = ggml_traits(t_).block_bytes;
    }
  }
  void operator()(size_t n, size_t k0, size_t kc, float* tmp, uint16_t* dst) const {
    const std::byte* row = a_.w + n * a_.ldw_bytes;
    if (block_) {  // kc is whole blocks, a multiple of 32
      dequantize_blocks_avx512(t_, row + k0 / block_ * block_bytes_, tmp, kc);
    } else {
      const auto* h = reinterpret_cast<const uint16_t*>(row) + k0;
      for (size_t k = 0; k < kc; k += 32)
        for (size_t j = k; j < k + 32; j += 16) {
          const size_t m = kc > j ? std::min<size_t>(16, kc - j) : 0;
          _mm512_store_ps(tmp + j, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(__mmask16((1u << m) - 1), h + j)));
        }
    }
    for (size_t k = 0; k < kc; k += 32) {
      const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_load_ps(tmp + k + 16), _mm512_load_ps(tmp + k));
      _mm512_store_si512(dst + k, reinterpret_cast<const __m512i&>(h));
    }
  }

 private:
  const GemmArgs& a_;
  GgmlType t_{};
  size_t block_ = 0, block_bytes_ = 0;  // 0: f16
};

class RoundedPacker {
 public:
  RoundedPacker(const GemmArgs& a, PanelLayout layout) : round_(a), dense_(a), layout_(layout) {
    dense_.w = reinterpret_cast<const std::byte*>(rows_);
    dense_.ldw_bytes = 2 * kKCb;
  }
  // W(n0 .. n0+cols, k0 .. k0+kc) into dst as pack_b_pairs packs it.
  void operator()(size_t n0, size_t cols, size_t k0, size_t kc, uint32_t* dst) {
    for (size_t i = 0; i < cols; ++i) round_(n0 + i, k0, kc, tmp_, rows_ + i * kKCb);
    pack_b_pairs(dense_, 0, cols, 0, kc, dst, layout_);
  }

 private:
  RowRounder round_;
  GemmArgs dense_;
  PanelLayout layout_;
  alignas(64) uint16_t rows_[kNR * kKCb];
  alignas(64) float tmp_[kKCb];
};
}  // namespace

void gemm_bf16dot_rounded(const GemmArgs& a, size_t nb, size_t ne, size_t mb, size_t me, float* pack) {
  gemm_bf16dot_with(a, nb, ne, mb, me, pack, RoundedPacker(a, PanelLayout::Rows));
}

// f16 weights on the tiles (docs/gguf.md, "f16 weights on the tiles"): a value w is hi + lo
// exactly, hi = w rounded to bf16 (nearest even) and lo = w − hi, which has at most three
// significant bits and so is a bf16 too. The product over K runs as one over 2K: x's values
// doubled into pairs (bf16_x) against the pairs (hi, lo). Twice the tile products of a bf16
// weight; the weight's every bit kept, as on the f32 FMAs. An Inf or NaN w keeps lo = 0.
namespace {
class F16PairPacker {
 public:
  explicit F16PairPacker(const GemmArgs& a) : a_(a), dense_(a) {
    dense_.w = reinterpret_cast<const std::byte*>(rows_);
    dense_.ldw_bytes = 2 * kKCb;
  }
  // W(n0 .. n0+cols) as pairs over [k0, k0 + kc) of the 2K pair values into dst as pack_b_pairs
  // packs them for the tiles (k0 and kc even).
  void operator()(size_t n0, size_t cols, size_t k0, size_t kc, uint32_t* dst) {
    const size_t n = kc / 2;
    for (size_t i = 0; i < cols; ++i) {
      const auto* w = reinterpret_cast<const uint16_t*>(a_.w + (n0 + i) * a_.ldw_bytes) + k0 / 2;
      auto* out = reinterpret_cast<__m512i*>(rows_ + i * kKCb);
      for (size_t k = 0; k < n; k += 16) {
        const __mmask16 m = n - k >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - k)) - 1);
        const __m512 f = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, w + k));
        const __m512i hi = _mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(f)));
        const __mmask16 finite = ~_mm512_fpclass_ps_mask(f, 0x99);  // not ±Inf or a NaN
        const __m512 lo = _mm512_maskz_sub_ps(finite, f, _mm512_castsi512_ps(_mm512_slli_epi32(hi, 16)));
        const __m512i lo16 = _mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(lo)));
        _mm512_store_si512(out + k / 16, _mm512_or_si512(hi, _mm512_slli_epi32(lo16, 16)));
      }
    }
    pack_b_pairs(dense_, 0, cols, 0, kc, dst, PanelLayout::Tiles);
  }

 private:
  const GemmArgs& a_;
  GemmArgs dense_;
  alignas(64) uint16_t rows_[kNR * kKCb];
};

// ---- AMX tiles (TDPBF16PS): the bf16 GEMM's products 512 to a tile instruction. Tiles 0-3 hold a
// 32 × 32 block of f32 sums, 4 and 5 two 16-row parts of x (16 rows × 32 bf16), 6 and 7 two
// 16-column parts of the weights (16 pairs × 16 words).

// The tile configuration (palette 1): eight tiles of 16 rows × 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// The tiles' operations, with the tile numbers as template arguments (the instructions encode
// them): on the hardware, and as a scalar model of it (Bf16Gemm::AmxModel, tests on CPUs without
// tiles), so that every CPU with AVX512-BF16 runs the kernels' blocking and layouts.
struct HwTiles {
  static void begin() {
    static const TileConfig config;
    _tile_loadconfig(&config);
  }
  static void end() { _tile_release(); }  // the tile state back to init: no 8 KiB saved at each switch
  // GCC's tile macros paste their tile number into the instruction's text: literals only.
  template <int T>
  static void load(const void* p, size_t stride) {
    static_assert(T >= 0 && T < 8);
    switch (T) {
      case 0: _tile_loadd(0, p, stride); break;
      case 1: _tile_loadd(1, p, stride); break;
      case 2: _tile_loadd(2, p, stride); break;
      case 3: _tile_loadd(3, p, stride); break;
      case 4: _tile_loadd(4, p, stride); break;
      case 5: _tile_loadd(5, p, stride); break;
      case 6: _tile_loadd(6, p, stride); break;
      case 7: _tile_loadd(7, p, stride); break;
    }
  }
  template <int T>
  static void store(void* p, size_t stride) {
    static_assert(T >= 0 && T < 4);
    switch (T) {
      case 0: _tile_stored(0, p, stride); break;
      case 1: _tile_stored(1, p, stride); break;
      case 2: _tile_stored(2, p, stride); break;
      case 3: _tile_stored(3, p, stride); break;
    }
  }
  template <int T>
  static void zero() {
    static_assert(T >= 0 && T < 4);
    switch (T) {
      case 0: _tile_zero(0); break;
      case 1: _tile_zero(1); break;
      case 2: _tile_zero(2); break;
      case 3: _tile_zero(3); break;
    }
  }
  // The four products of a 2 × 2 block: sums 0-3, x halves 4 and 5, panel parts 6 and 7; or of a
  // 1 × 4 block, sums 2 and 3 from tile 4 too (dot_amx with 64 x rows).
  template <int C, int A, int B>
  static void dot() {
    static_assert(C >= 0 && C < 4 && (A == 4 + C / 2 || (A == 4 && C >= 2)) && B == 6 + C % 2);
    switch (C + 4 * (A - 4)) {
      case 0: _tile_dpbf16ps(0, 4, 6); break;
      case 1: _tile_dpbf16ps(1, 4, 7); break;
      case 2: _tile_dpbf16ps(2, 4, 6); break;
      case 3: _tile_dpbf16ps(3, 4, 7); break;
      case 6: _tile_dpbf16ps(2, 5, 6); break;
      case 7: _tile_dpbf16ps(3, 5, 7); break;
    }
  }
};

// TDPBF16PS as Intel's SDM writes it: C[m][n] (f32) += A[m][2p + 1]·B[p][2n + 1], then += A[m][2p]·B[p][2n],
// for each pair p in turn, bf16 subnormal inputs read as zero and subnormal sums flushed.
struct ModelTiles {
  static inline thread_local uint8_t tile[8][16][64];
  static void begin() {}
  static void end() {}
  template <int T>
  static void load(const void* p, size_t stride) {
    for (size_t r = 0; r < 16; ++r) std::memcpy(tile[T][r], static_cast<const std::byte*>(p) + r * stride, 64);
  }
  template <int T>
  static void store(void* p, size_t stride) {
    for (size_t r = 0; r < 16; ++r) std::memcpy(static_cast<std::byte*>(p) + r * stride, tile[T][r], 64);
  }
  template <int T>
  static void zero() {
    std::memset(tile[T], 0, sizeof(tile[T]));
  }
  template <int C, int A, int B>
  static void dot() {
    auto bf = [](const uint8_t* row, size_t i) {
      uint16_t h;
      std::memcpy(&h, row + 2 * i, 2);
      return (h & 0x7F80) == 0 ? 0.f : bf16_to_f32(h);  // DAZ
    };
    for (size_t m = 0; m < 16; ++m)
      for (size_t n = 0; n < 16; ++n) {
        float c;
        std::memcpy(&c, tile[C][m] + 4 * n, 4);
        for (size_t p = 0; p < 16; ++p) {
          c += bf(tile[A][m], 2 * p + 1) * bf(tile[B][p], 2 * n + 1);
          c += bf(tile[A][m], 2 * p) * bf(tile[B][p], 2 * n);
        }
        if (std::fabs(c) < 1.17549435e-38f) c = std::copysign(0.f, c);  // FTZ
        std::memcpy(tile[C][m] + 4 * n, &c, 4);
      }
  }
};

// f(HwTiles{}), or f(ModelTiles{}) where a kernel's arguments ask for the model.
template <class F>
void on_tiles(bool model, F&& f) {
  if (model) return f(ModelTiles{});
  f(HwTiles{});
}

// Where a tile operand's tiles lie: 16 rows of 64 bytes `row` bytes apart, the next 16 pairs of K
// `step` bytes on, the next 16 rows of x (A) or 16 columns (B) `next` bytes on.
struct TileOperand {
  const void* p;
  size_t row, step, next;
  const void* at(size_t s, size_t i) const { return static_cast<const std::byte*>(p) + s * step + i * next; }
};

// C[0:32, 0:64] (rows ldc floats apart) = (first) or += A · B over kp pairs, the second 32 columns
// only when `wide`: A's first two 16-row parts (x as bf16 words, a word a pair) against B's four
// 16-column parts (pairs × columns of words); both whole 16-pair steps readable, zero past kp
// and past x's last row.
template <class Tiles>
void micro_amx(size_t kp, const TileOperand& A, const TileOperand& B, float* C, size_t ldc, bool first, bool wide) {
  const size_t steps = (kp + 15) / 16, sc = ldc * 4;
  for (size_t h = 0; h < (wide ? 2 : 1); ++h) {
    float* c = C + 32 * h;
    if (first) {
      Tiles::template zero<0>();
      Tiles::template zero<1>();
      Tiles::template zero<2>();
      Tiles::template zero<3>();
    } else {
      Tiles::template load<0>(c, sc);
      Tiles::template load<1>(c + 16, sc);
      Tiles::template load<2>(c + 16 * ldc, sc);
      Tiles::template load<3>(c + 16 * ldc + 16, sc);
    }
    for (size_t s = 0; s < steps; ++s) {
      Tiles::template load<4>(A.at(s, 0), A.row);
      Tiles::template load<5>(A.at(s, 1), A.row);
      Tiles::template load<6>(B.at(s, 2 * h), B.row);
      Tiles::template load<7>(B.at(s, 2 * h + 1), B.row);
      Tiles::template dot<0, 4, 6>();
      Tiles::template dot<1, 4, 7>();
      Tiles::template dot<2, 5, 6>();
      Tiles::template dot<3, 5, 7>();
    }
    Tiles::template store<0>(c, sc);
    Tiles::template store<1>(c + 16, sc);
    Tiles::template store<2>(c + 16 * ldc, sc);
    Tiles::template store<3>(c + 16 * ldc + 16, sc);
  }
}

// y[mb:me, nb:ne] on micro_amx: per kAmxNc columns and kAmxKc values of K, the block's weights packed
// as whole tiles (pack_b: 64 columns × kKCb values at a time), then per 32 rows of x (their tiles,
// read from L3 once, then from L2) each 32 columns' sums over the whole K block in the tiles: a
// sum leaves the tiles once per K block, not once per kKCb (a store and reload of the four sums
// cost as much as 16 of their products). x is in whole tiles (a.xq, matmul.cpp tile_x: a.ldxq
// bytes a 16-row group). y = the sums + bias, 32 × 32 at a time.
template <class Tiles, class PackB>
void gemm_amx_with(const GemmArgs& a, size_t nb, size_t ne, size_t mb, size_t me, float* pack, PackB&& pack_b) {
  static_assert(kAmxNc * kAmxKc / 2 <= 2 * kNC * kKC, "pack buffer too small");
  Tiles::begin();
  auto* bpack = reinterpret_cast<uint32_t*>(pack);
  const size_t rows = (me - mb + kAmxTileRows - 1) / kAmxTileRows * kAmxTileRows;
  // The sums between K blocks in a scratch, else only 32 rows of it; rows an odd number of lines
  // apart (a tile's 16 rows in 16 L1 sets).
  const bool blocks = a.K > kAmxKc;
  constexpr size_t ldc = kAmxNc + 16;
  thread_local HugePageVector<float> sums_buf;
  sums_buf.resize((blocks ? rows : kAmxTileRows) * ldc);
  for (size_t n0 = nb; n0 < ne; n0 += kAmxNc) {
    const size_t nc = ne - n0 < kAmxNc ? ne - n0 : kAmxNc;
    for (size_t k0 = 0; k0 < a.K; k0 += kAmxKc) {
      const size_t kc = a.K - k0 < kAmxKc ? a.K - k0 : kAmxKc, kp = (kc + 1) / 2;
      for (size_t c = 0; c < nc; c += kNR)
        for (size_t kk = 0; kk < kc; kk += kKCb)
          pack_b(n0 + c, std::min(kNR, nc - c), k0 + kk, std::min(kKCb, kc - kk),
                 bpack + c / 16 * kTileGroupWords + kk / 2 * 16);
      const bool first = k0 == 0, last = k0 + kc >= a.K;
      for (size_t m = mb; m < me; m += kAmxTileRows) {
        const TileOperand A{a.xq + m / 16 * a.ldxq + k0 / 32 * 1024, 64, 1024, a.ldxq};
        float* srow = sums_buf.data() + (blocks ? (m - mb) * ldc : 0);
        for (size_t c = 0; c < nc; c += 32) {
          const TileOperand B{bpack + c / 16 * kTileGroupWords, 64, 1024, kTileGroupWords * 4};
          micro_amx<Tiles>(kp, A, B, srow + c, ldc, first, false);
          if (!last) continue;
          const size_t rm = std::min(kAmxTileRows, me - m), cn = std::min<size_t>(32, nc - c), n = n0 + c;
          const __mmask16 k0m = __mmask16(cn >= 16 ? 0xFFFF : (1u << cn) - 1);
          const __mmask16 k1m = __mmask16(cn >= 32 ? 0xFFFF : cn > 16 ? (1u << (cn - 16)) - 1 : 0);
          const __m512 b0 = a.bias ? _mm512_maskz_loadu_ps(k0m, a.bias + n) : _mm512_setzero_ps();
          const __m512 b1 = a.bias ? _mm512_maskz_loadu_ps(k1m, a.bias + n + 16) : _mm512_setzero_ps();
          for (size_t r = 0; r < rm; ++r) {
            const float* src = srow + r * ldc + c;
            float* dst = a.y + (m + r) * a.ldy + n;
            _mm512_mask_storeu_ps(dst, k0m, _mm512_add_ps(_mm512_load_ps(src), b0));
            _mm512_mask_storeu_ps(dst + 16, k1m, _mm512_add_ps(_mm512_load_ps(src + 16), b1));
          }
        }
      }
    }
  }
  Tiles::end();
}

void gemm_amx(const GemmArgs& a, size_t nb, size_t ne, size_t mb, size_t me, float* pack) {
  auto pack_b = [&](size_t n0, size_t cols, size_t k0, size_t kc, uint32_t* dst) {
    pack_b_pairs(a, n0, cols, k0, kc, dst, PanelLayout::Tiles);
  };
  on_tiles(a.tiles_model, [&](auto t) { gemm_amx_with<decltype(t)>(a, nb, ne, mb, me, pack, pack_b); });
}

void gemm_amx_f16(const GemmArgs& a, size_t nb, size_t ne, size_t mb, size_t me, float* pack) {
  if (a.bf16_exact) return gemm_amx_rounded(a, nb, ne, mb, me, pack);  // hi alone: lo is zero
  GemmArgs pairs = a;
  pairs.K = 2 * a.K;  // x doubled into pairs by tile_x, W as (hi, lo): F16PairPacker
  on_tiles(a.tiles_model, [&](auto t) { gemm_amx_with<decltype(t)>(pairs, nb, ne, mb, me, pack, F16PairPacker(a)); });
}

// bf16 weights as the tiles' A operand, for products of up to kAmxDotRows rows (batched decode, short
// prompts; docs/gguf.md, "Few rows on AMX tiles"): an A tile is 16 weight rows × 32 values loaded
// from the matrix as stored (its row bytes the stride), so nothing is packed; x is the B operand,
// laid out once per product as pair columns (xq: [pairs][Cols] words, zero past K and M). Up to
// 32 x rows a block is 32 weight rows (tiles 4 and 5), the sums 0 and 2 against x rows 0-15, 1 and
// 3 against 16-31; with 64 x rows it is 16 weight rows (tile 4), sums 0-3 against x rows 0-15, ...,
// 48-63, tiles 6 and 7 loaded twice a step.
template <class Tiles, size_t Cols>
void dot_amx_steps(size_t steps, const uint32_t* w, size_t stride, const uint32_t* xp) {
  // No software prefetch: asking for each row's bytes 256 B to 8 KiB ahead (T0 or T1, or in bursts of
  // a row at a time) left these loops 3-20 % slower (docs/gguf.md, "Few rows on AMX tiles").
  for (size_t s = 0; s < steps; ++s) {
    const uint32_t* x = xp + s * 16 * Cols;
    Tiles::template load<4>(w + 16 * s, stride);
    Tiles::template load<6>(x, Cols * 4);
    if constexpr (Cols == 64) {
      Tiles::template load<7>(x + 16, Cols * 4);
      Tiles::template dot<0, 4, 6>();
      Tiles::template dot<1, 4, 7>();
      Tiles::template load<6>(x + 32, Cols * 4);
      Tiles::template load<7>(x + 48, Cols * 4);
      Tiles::template dot<2, 4, 6>();
      Tiles::template dot<3, 4, 7>();
    } else {
      Tiles::template load<5>(reinterpret_cast<const std::byte*>(w + 16 * s) + 16 * stride, stride);
      if constexpr (Cols == 32) Tiles::template load<7>(x + 16, Cols * 4);
      Tiles::template dot<0, 4, 6>();
      Tiles::template dot<2, 5, 6>();
      if constexpr (Cols == 32) {
        Tiles::template dot<1, 4, 7>();
        Tiles::template dot<3, 5, 7>();
      }
    }
  }
}

// A block of weight rows: its sums zeroed, then y[:, n:n+rows] = them (+ bias). Sum t holds weight
// rows 16 (t / 2) on against x rows 16 (t % 2) on, or with 64 x rows (16-row blocks) x rows 16 t on.
template <class Tiles>
void zero_sums() {
  Tiles::template zero<0>();
  Tiles::template zero<1>();
  Tiles::template zero<2>();
  Tiles::template zero<3>();
}

template <class Tiles, size_t Cols>
void store_sums(const GemmArgs& a, size_t n, size_t rows) {
  constexpr size_t ldc = Cols == 64 ? 64 : 32, at2 = Cols == 64 ? 32 : 16 * ldc, at3 = Cols == 64 ? 48 : 16 * ldc + 16;
  alignas(64) float c[32 * 32];
  Tiles::template store<0>(c, 4 * ldc);
  Tiles::template store<1>(c + 16, 4 * ldc);
  Tiles::template store<2>(c + at2, 4 * ldc);
  Tiles::template store<3>(c + at3, 4 * ldc);
  for (size_t r = 0; r < rows; ++r) {
    const float b = a.bias ? a.bias[n + r] : 0.f;
    for (size_t m = 0; m < a.M; ++m) a.y[m * a.ldy + n + r] = c[ldc * r + m] + b;
  }
}

template <class Tiles, size_t Cols>
void dot_amx_with(const GemmArgs& a, size_t n0, size_t n1) {
  constexpr size_t block = Cols == 64 ? 16 : 32;  // weight rows
  const auto* xp = reinterpret_cast<const uint32_t*>(a.xq);
  const size_t steps = a.K / 32, tail = a.K % 32;
  // A block of fewer weight rows than a whole one, and the K tail past whole 32-value steps, are
  // copied into zero-padded scratch first: the tiles read whole blocks and steps.
  thread_local std::vector<uint16_t> rows_buf;
  alignas(64) uint16_t tail_tile[block * 32];
  Tiles::begin();
  for (size_t n = n0; n < n1; n += block) {
    const size_t rows = std::min(block, n1 - n);
    const std::byte* w = a.w + n * a.ldw_bytes;
    size_t stride = a.ldw_bytes;
    if (rows < block) {
      size_t ld = (a.K + 31) / 32 * 32;
      if (ld / 32 % 2 == 0) ld += 32;  // rows an odd number of lines apart
      rows_buf.assign(block * ld + 32, 0);
      auto* dst = reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(rows_buf.data()) + 63) & ~uintptr_t(63));
      for (size_t r = 0; r < rows; ++r) std::memcpy(dst + r * ld, w + r * a.ldw_bytes, 2 * a.K);
      w = reinterpret_cast<const std::byte*>(dst), stride = 2 * ld;
    }
    zero_sums<Tiles>();
    dot_amx_steps<Tiles, Cols>(steps, reinterpret_cast<const uint32_t*>(w), stride, xp);
    if (tail) {
      std::memset(tail_tile, 0, sizeof(tail_tile));
      for (size_t r = 0; r < block; ++r) std::memcpy(tail_tile + 32 * r, w + r * stride + 64 * steps, 2 * tail);
      dot_amx_steps<Tiles, Cols>(1, reinterpret_cast<const uint32_t*>(tail_tile), 64, xp + steps * 16 * Cols);
    }
    store_sums<Tiles, Cols>(a, n, rows);
  }
  Tiles::end();
}

void dot_amx(const GemmArgs& a, size_t n0, size_t n1) {
  on_tiles(a.tiles_model, [&](auto t) {
    switch (a.ldxq / 4) {  // pair_x's columns
      case 16: return dot_amx_with<decltype(t), 16>(a, n0, n1);
      case 32: return dot_amx_with<decltype(t), 32>(a, n0, n1);
      default: return dot_amx_with<decltype(t), 64>(a, n0, n1);
    }
  });
}

// Block-format weights on dot_amx's tiles (33..64 x rows): each block of 16 weight rows is
// dequantized exactly and rounded to bf16 (RowRounder) 256 values (whole blocks of
// every format) at a time into scratch rows, which the A tiles read; no panels are packed.
template <class Tiles>
void dot_amx_rounded_with(const GemmArgs& a, size_t n0, size_t n1) {
  constexpr size_t block = 16, cols = 64;
  const RowRounder round(a);
  const auto* xp = reinterpret_cast<const uint32_t*>(a.xq);
  alignas(64) uint16_t rows[block * kKCb];
  alignas(64) float tmp[kKCb];
  Tiles::begin();
  for (size_t n = n0; n < n1; n += block) {
    const size_t nr = std::min(block, n1 - n);
    zero_sums<Tiles>();
    for (size_t k0 = 0; k0 < a.K; k0 += kKCb) {
      const size_t kc = std::min(kKCb, a.K - k0);  // whole blocks: a multiple of 32
      for (size_t r = 0; r < block; ++r) {
        if (r < nr) round(n + r, k0, kc, tmp, rows + r * kKCb);
        else std::memset(rows + r * kKCb, 0, 2 * kc);
      }
      dot_amx_steps<Tiles, cols>(kc / 32, reinterpret_cast<const uint32_t*>(rows), 2 * kKCb, xp + k0 / 2 * cols);
    }
    store_sums<Tiles, cols>(a, n, nr);
  }
  Tiles::end();
}
}  // namespace

void dot_amx_rounded(const GemmArgs& a, size_t n0, size_t n1) {
  on_tiles(a.tiles_model, [&](auto t) { dot_amx_rounded_with<decltype(t)>(a, n0, n1); });
}

// ---- attention's products on the bf16 dot (matmul.h, attend): keys, values, queries
// and probabilities as bf16, f32 sums, on micro_bf16.

// A row of d values as bf16 (to_bf16), d rounded up to even with a zero, so that values 2i and
// 2i + 1 make pair i. Converting each pair on its own took 5 % of SigLIP's attention (`perf`).
const uint16_t* bf16_row(const float* r, size_t d, std::vector<uint16_t>& buf) {
  buf.resize((d + 1) / 2 * 2);
  buf.back() = 0;
  to_bf16(r, buf.data(), d, Isa::Avx512);
  return buf.data();
}
inline uint32_t pair_word(uint16_t lo, uint16_t hi) { return uint32_t(lo) | uint32_t(hi) << 16; }

// The rows bf16_row converts are one head's d values of a wider matrix (q, k, v: a row of every
// head), each a few lines in another page, whose next row the hardware prefetchers did not ask
// for (SigLIP: 76 % of to_bf16's samples on its first load, `perf annotate`); the row kRowsAhead
// on is asked for into L1 while this one converts.
constexpr size_t kRowsAhead = 8;
inline void prefetch_row(const float* r, size_t d) {
  const auto end = reinterpret_cast<uintptr_t>(r + d);
  for (uintptr_t line = reinterpret_cast<uintptr_t>(r) & ~uintptr_t(63); line < end; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(line), _MM_HINT_T0);
}

void pack_keys_bf16(const float* k, size_t ld, size_t n, size_t d, uint32_t* dst, size_t pair_rows, bool tiles) {
  const size_t dp = (d + 1) / 2, panels = (n + kNR - 1) / kNR;
  thread_local std::vector<uint16_t> buf;
  for (size_t p = 0; p < panels; ++p) {
    uint32_t* panel = dst + p * pair_rows * kNR;
    for (size_t j = 0; j < kNR; ++j) {
      const size_t key = p * kNR + j;
      if (key + kRowsAhead < n) prefetch_row(k + (key + kRowsAhead) * ld, d);
      const uint16_t* h = key < n ? bf16_row(k + key * ld, d, buf) : nullptr;
      // Word (i, j): row i of the panel, or of key j's group of 16.
      uint32_t* col = tiles ? panel + j / 16 * pair_rows * 16 + j % 16 : panel + j;
      const size_t ldc = tiles ? 16 : kNR;
      for (size_t i = 0; i < pair_rows; ++i) col[i * ldc] = h && i < dp ? pair_word(h[2 * i], h[2 * i + 1]) : 0;
    }
  }
}

// Value columns past the last whole vector of 16, when they fit half a vector (SigLIP's d = 72:
// 8): packed two pairs of keys to a vector, so that one vdpbf16ps takes 8 columns × 2 pairs
// instead of 8 columns × 1 pair and 8 lanes of zeros (micro_bf16_tail). With the plain layout
// their 6 × 1 tile took 5.8 % of an image's encode for 1/9 of P·v's columns.
inline size_t interleaved_tail(size_t d) { return d % 16 <= 8 ? d % 16 : 0; }

void pack_values_bf16(const float* v, size_t ld, size_t n, size_t d, uint32_t* dst, bool tiles) {
  const size_t dv = (d + 15) / 16 * 16, pairs = (n + kNR - 1) / kNR * kNR / 2;  // pairs: whole panels, even
  const size_t tail = tiles ? 0 : interleaved_tail(d), full = d - tail;
  thread_local std::vector<uint16_t> buf[4];
  for (size_t p = 0; p < pairs; p += 2) {
    const uint16_t* key[4];  // keys 2p .. 2p + 3 as bf16, zeros past n
    for (size_t i = 0; i < 4; ++i) {
      if (2 * p + i + kRowsAhead < n) prefetch_row(v + (2 * p + i + kRowsAhead) * ld, d);
      if (2 * p + i < n) {
        key[i] = bf16_row(v + (2 * p + i) * ld, d, buf[i]);
      } else {
        buf[i].assign(d, 0);
        key[i] = buf[i].data();
      }
    }
    for (size_t h = 0; h < 2; ++h) {
      if (tiles) {  // the zero columns past d stay as pack_kv assigned them
        for (size_t j = 0; j < d; ++j)
          dst[j / 16 * pairs * 16 + (p + h) * 16 + j % 16] = pair_word(key[2 * h][j], key[2 * h + 1][j]);
        continue;
      }
      uint32_t* row = dst + (p + h) * dv;
      for (size_t j = 0; j < dv; ++j) row[j] = j < full ? pair_word(key[2 * h][j], key[2 * h + 1][j]) : 0;
    }
    // The tail of pairs p and p + 1 in row p: word 2t + s holds pair p + s of column full + t.
    for (size_t t = 0; t < tail; ++t)
      for (size_t s = 0; s < 2; ++s)
        dst[p * dv + full + 2 * t + s] = pair_word(key[2 * s][full + t], key[2 * s + 1][full + t]);
  }
}

// R rows of A (words [kp] each, lda apart) × the interleaved tail of the values at B (rows ldb
// words apart; B an even row, kp even: whole panels of keys): lanes 2t and 2t + 1 sum column t
// over the even and the odd pairs, added at the end. y as store_tile writes it, `cols` (at most 8)
// columns.
template <int R>
void micro_bf16_tail(size_t kp, const uint32_t* A, size_t lda, const uint32_t* B, size_t ldb, float* y, size_t ldy,
                     size_t cols, bool first) {
  __m512 acc[R];
  VLM_UNROLL
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (size_t p = 0; p < kp; p += 2) {
    const __m512i b = _mm512_loadu_si512(B + p * ldb);
    VLM_UNROLL
    for (int r = 0; r < R; ++r) {
      const uint32_t* ar = A + r * lda + p;
      const __m512i x = _mm512_set1_epi64(int64_t(uint64_t(ar[0]) | uint64_t(ar[1]) << 32));
      acc[r] = _mm512_dpbf16_ps(acc[r], reinterpret_cast<const __m512bh&>(x), reinterpret_cast<const __m512bh&>(b));
    }
  }
  const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14);
  VLM_UNROLL
  for (int r = 0; r < R; ++r) {
    const __m512 both = _mm512_add_ps(acc[r], _mm512_permute_ps(acc[r], _MM_SHUFFLE(2, 3, 0, 1)));
    const __m256 sum = _mm512_castps512_ps256(_mm512_permutexvar_ps(evens, both));
    const __mmask8 m = __mmask8((1u << cols) - 1);
    float* yr = y + r * ldy;
    _mm256_mask_storeu_ps(yr, m, first ? sum : _mm256_add_ps(sum, _mm256_maskz_loadu_ps(m, yr)));
  }
}

using MicroBf16Tail = void (*)(size_t, const uint32_t*, size_t, const uint32_t*, size_t, float*, size_t, size_t, bool);
template <size_t... R>
constexpr std::array<MicroBf16Tail, sizeof...(R)> tail_table(std::index_sequence<R...>) {
  return {&micro_bf16_tail<int(R) + 1>...};
}

namespace {
// The query rows as bf16 pairs, row r at dst + r * ld words.
void query_pairs(const AttendArgs& a, uint32_t* dst, size_t ld) {
  thread_local std::vector<uint16_t> buf;
  const size_t dp = (a.d + 1) / 2;
  for (size_t r = 0; r < a.rows; ++r) {
    if (r + kRowsAhead < a.rows) prefetch_row(a.q + (r + kRowsAhead) * a.ldq, a.d);
    std::memcpy(dst + r * ld, bf16_row(a.q + r * a.ldq, a.d, buf), dp * 4);
  }
}

// A row of scores over whole key panels (w of them) becomes its probabilities as bf16 pairs, 16
// pairs (64 bytes) at `out`, the next 16 `step` words on (16: the row's own first w / 2 words): the
// softmax of the n scores from `off` on (scale, mask: scaled_exp's), zero for the keys outside
// them, the division folded into the conversion to bf16.
void probabilities_as_pairs(float* row, size_t w, size_t off, size_t n, float scale, const float* mask,
                            uint32_t* out, size_t step) {
  float* x = row + off;
  const float sum = scaled_exp(x, n, scale, mask, Isa::Avx512);
  const __m512 inv = _mm512_set1_ps(sum > 0.f ? 1.f / sum : 0.f);
  std::fill(row, x, 0.f);
  std::fill(x + n, row + w, 0.f);
  // In place (out = row, step 16): pairs j / 2 .. j / 2 + 15 take the bytes of scores j / 2 ..
  // j / 2 + 15, which are read before (j = 0) or were read by an earlier step.
  for (size_t j = 0; j < w; j += 32) {
    const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_mul_ps(_mm512_loadu_ps(row + j + 16), inv),
                                           _mm512_mul_ps(_mm512_loadu_ps(row + j), inv));
    _mm512_storeu_si512(out + j / 32 * step, reinterpret_cast<const __m512i&>(h));
  }
}
}  // namespace

void attend_bf16(const AttendArgs& a) {
  const MicroTable& table = micro_table();
  const size_t d = a.d, dp = (d + 1) / 2, dv = (d + 15) / 16 * 16;
  // Scores over whole key panels [a0, a1); the keys outside [k0, k1) get probability 0.
  const size_t a0 = a.k0 / kNR * kNR, a1 = (a.k1 + kNR - 1) / kNR * kNR, w = a1 - a0, wp = w / 2;
  // The A operands, a word per bf16 pair: the queries, and the probabilities, which replace the
  // first half of their own score row (a separate 96 × 4096-pair buffer missed on every store:
  // 70 % of this function's samples, `perf annotate`).
  thread_local std::vector<uint32_t> qa;
  thread_local std::vector<float> scores;
  qa.resize(a.rows * dp);
  scores.resize(a.rows * w);
  const auto* pa = reinterpret_cast<const uint32_t*>(scores.data());
  query_pairs(a, qa.data(), dp);
  // A register tile of rows at a time: its scores over every key panel, then their softmax while
  // they are in L2. With the panels outside and every tile inside, the keys stayed in L1 but the
  // softmax read all 96 rows of scores back from L3 (one SigLIP layer's attention 183–193 ms,
  // against 169–173 ms this way; docs/performance.md, "2026-12-04: SigLIP's attention").
  const size_t n = a.k1 - a.k0;
  for (size_t m = 0; m < a.rows; m += kMR) {
    const size_t rm = std::min(kMR, a.rows - m);
    for (size_t p = a0 / kNR; p < a1 / kNR; ++p)
      table.f[rm - 1][3](dp, qa.data() + m * dp, dp, a.key_pairs + p * dp * kNR, kNR,
                         scores.data() + m * w + (p * kNR - a0), w, kNR, true, nullptr);
    for (size_t r = m; r < m + rm; ++r)
      probabilities_as_pairs(scores.data() + r * w, w, a.k0 - a0, n, a.scale, a.mask ? a.mask + r * a.ldm : nullptr,
                             reinterpret_cast<uint32_t*>(scores.data() + r * w), 16);
  }
  // o = P·v, in blocks of kKCb keys so a block of values stays in L1 across the rows; the blocks
  // start on even pairs, as the interleaved tail needs (a0 is whole panels, kKCb / 2 even).
  static constexpr auto tails = tail_table(std::make_index_sequence<kMR>());
  const size_t tail = interleaved_tail(d), full = d - tail;
  for (size_t kb = 0; kb < wp; kb += kKCb / 2) {
    const size_t kc = std::min(kKCb / 2, wp - kb);
    const uint32_t* vb = a.value_pairs + (a0 / 2 + kb) * dv;
    for (size_t c0 = 0; c0 < full; c0 += kNR) {
      const size_t cols = std::min(kNR, full - c0);
      for (size_t m = 0; m < a.rows; m += kMR)
        table.f[std::min(kMR, a.rows - m) - 1][(cols + 15) / 16 - 1](
            kc, pa + m * w + kb, w, vb + c0, dv, a.out + m * a.ldo + c0, a.ldo, cols, kb == 0, nullptr);
    }
    if (tail)
      for (size_t m = 0; m < a.rows; m += kMR)
        tails[std::min(kMR, a.rows - m) - 1](kc, pa + m * w + kb, w, vb + full, dv, a.out + m * a.ldo + full, a.ldo,
                                             tail, kb == 0);
  }
}

// Attention's products on the AMX tiles (matmul.h, attend; Bf16Gemm Amx and AmxModel), as attend_bf16
// computes them: 32 query rows at a time, their scores over every key panel (keys packed as whole
// tiles, their pairs zero-padded to whole 16-pair steps), the softmax into bf16 pairs as whole
// tiles, then P · v over the values, also packed as whole tiles.
template <class Tiles>
void attend_amx_with(const AttendArgs& a) {
  const size_t d = a.d, dp = (d + 1) / 2, dpa = (dp + 15) / 16 * 16, dv = (d + 15) / 16 * 16;
  const size_t a0 = a.k0 / kNR * kNR, a1 = (a.k1 + kNR - 1) / kNR * kNR, w = a1 - a0, wp = w / 2, n = a.k1 - a.k0;
  const size_t value_group = (a.n + kNR - 1) / kNR * kNR / 2 * 16;  // words of 16 value columns (pack_values_bf16)
  // Score rows 16 floats longer than whole panels (4096 keys would put a tile's 16 rows in one L1
  // set); the outputs' columns in whole 64-column blocks. Every tile operand whole and on a line
  // (pack_keys_bf16 and pack_values_bf16 with tiles, the probabilities in pt): tile rows apart, or
  // split across two lines, ran the products at a third of their rate.
  const size_t lds = w + 16, oc = (dv + kNR - 1) / kNR * kNR;
  thread_local HugePageVector<uint32_t> qa, pt;
  thread_local HugePageVector<float> scores, o;
  qa.assign((a.rows + kAmxTileRows - 1) / kAmxTileRows * kAmxTileRows * dpa, 0);
  pt.resize(kAmxTileRows * wp);  // two groups of 16 rows, each [wp / 16 steps][16 rows][16 pairs]
  scores.resize(kAmxTileRows * lds);
  o.resize(kAmxTileRows * oc);
  query_pairs(a, qa.data(), dpa);
  Tiles::begin();
  for (size_t m = 0; m < a.rows; m += kAmxTileRows) {
    const size_t rm = std::min(kAmxTileRows, a.rows - m);
    const TileOperand q{qa.data() + m * dpa, dpa * 4, 64, 16 * dpa * 4};
    for (size_t p = a0 / kNR; p < a1 / kNR; ++p)
      micro_amx<Tiles>(dpa, q, {a.key_pairs + p * dpa * kNR, 64, 1024, dpa * 16 * 4}, scores.data() + (p * kNR - a0),
                       lds, true, true);
    for (size_t r = 0; r < kAmxTileRows; ++r) {
      uint32_t* out = pt.data() + r / 16 * wp * 16 + r % 16 * 16;
      if (r >= rm) {  // a row past the last: probabilities 0
        for (size_t s = 0; s < wp / 16; ++s) std::fill(out + s * 256, out + s * 256 + 16, 0u);
        continue;
      }
      probabilities_as_pairs(scores.data() + r * lds, w, a.k0 - a0, n, a.scale,
                             a.mask ? a.mask + (m + r) * a.ldm : nullptr, out, 256);
    }
    const TileOperand probs{pt.data(), 64, 1024, wp * 16 * 4};
    for (size_t c0 = 0; c0 < dv; c0 += kNR)
      micro_amx<Tiles>(wp, probs, {a.value_pairs + c0 / 16 * value_group + a0 / 2 * 16, 64, 1024, value_group * 4},
                       o.data() + c0, oc, true, dv - c0 > 32);
    for (size_t r = 0; r < rm; ++r) std::memcpy(a.out + (m + r) * a.ldo, o.data() + r * oc, d * 4);
  }
  Tiles::end();
}

void attend_amx(const AttendArgs& a) {
  on_tiles(a.tiles_model, [&](auto t) { attend_amx_with<decltype(t)>(a); });
}

double bf16_dot_loop(size_t iters) {
  constexpr int N = 12;  // independent chains: more than latency × throughput of vdpbf16ps
  const __m512i ones = _mm512_set1_epi16(0x3A83);  // bf16 ≈ 1e-3: the sums stay small
  const __m512bh a = reinterpret_cast<const __m512bh&>(ones);
  __m512 acc[N];
  VLM_UNROLL
  for (int i = 0; i < N; ++i) acc[i] = _mm512_set1_ps(float(i));
  for (size_t it = 0; it < iters; ++it) {
    VLM_UNROLL
    for (int i = 0; i < N; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, a);
  }
  __m512 s = acc[0];
  VLM_UNROLL
  for (int i = 1; i < N; ++i) s = _mm512_add_ps(s, acc[i]);
  volatile float sink = _mm512_reduce_add_ps(s);
  (void)sink;
  return 64.0 * double(iters) * N;  // 16 lanes × 2 products × (multiply + add)
}

double amx_loop(size_t iters) {
  using T = HwTiles;
  T::begin();
  alignas(64) uint16_t small[16 * 32];
  std::fill(small, small + 16 * 32, uint16_t(0x3A83));  // bf16 ≈ 1e-3: the sums stay small
  T::load<4>(small, 64);
  T::load<5>(small, 64);
  T::load<6>(small, 64);
  T::load<7>(small, 64);
  T::zero<0>();
  T::zero<1>();
  T::zero<2>();
  T::zero<3>();
  for (size_t it = 0; it < iters; ++it) {
    T::dot<0, 4, 6>();
    T::dot<1, 4, 7>();
    T::dot<2, 5, 6>();
    T::dot<3, 5, 7>();
  }
  alignas(64) float sink[16 * 16];
  T::store<0>(sink, 64);
  T::end();
  volatile float v = sink[0];
  (void)v;
  return 4.0 * 2 * 16 * 16 * 32 * double(iters);  // 4 tiles × 16 × 16 outputs × 32 products each
}

void gemm_amx_rounded(const GemmArgs& a, size_t nb, size_t ne, size_t mb, size_t me, float* pack) {
  on_tiles(a.tiles_model, [&](auto t) {
    gemm_amx_with<decltype(t)>(a, nb, ne, mb, me, pack, RoundedPacker(a, PanelLayout::Tiles));
  });
}

const IsaKernels kAvx512Kernels =
    make_kernels<S512>("avx512", {.gemm_bf16 = &gemm_bf16dot_rounded, .gemm_amx = &gemm_amx_f16},
                       {.gemm_bf16 = &gemm_bf16dot, .gemm_amx = &gemm_amx, .dot_bf16 = &dot_bf16dot,
                        .dot_bf16_fma = &dot_bf16_fma, .dot_amx = &dot_amx});

}  // namespace vlm::kernels::detail
