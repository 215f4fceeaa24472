// ISA-generic bodies of the matmul kernels, written against a SIMD traits class S:
//   S::V, S::W (floats per vector), S::MR (rows per register tile), S::NV (vectors
//   per tile row), S::DOT_RM / S::DOT_RN2 (tile for M > 1), zero/load/store/bcast/fma/add/hsum,
//   load_bf16/load_f16 (exact widening of W elements), transpose (W×W in place).
// Every function is a template on S (or static), and each ISA file defines S with
// internal linkage, so the instantiations of different ISAs never merge at link time.
#pragma once
#include <array>
#include <cmath>  // INFINITY
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kernels/matmul_isa.h"
#include "kernels/ops.h"
#include "kernels/simd.h"

namespace vlm::kernels::detail {

// K and N block sizes of the packed path. y is read and written once per K block, so a
// large KC matters when y does not fit in cache (M = 4096: 63% → 82% of peak going from
// 128 to 384 on Zen 5); the packed micro-panel (KC × 64 f32, 96 KiB) then streams from L2.
inline constexpr size_t kKC = 384;
inline constexpr size_t kNC = 512;

// Columns per packed block: at most kNC, split evenly (in whole panels of nr) so the
// last block is not a sliver that streams all of x for a few columns.
static inline size_t column_block(size_t n, size_t nr) {  // static: no shared copy across ISA files
  const size_t blocks = (n + kNC - 1) / kNC;
  const size_t per = (n + blocks - 1) / blocks;
  return (per + nr - 1) / nr * nr;
}

template <DType D>
inline constexpr size_t kElemSize = D == DType::F32 ? 4 : 2;

template <class S, DType D>
inline typename S::V load_w(const std::byte* p) {
  if constexpr (D == DType::F32)
    return S::load(reinterpret_cast<const float*>(p));
  else if constexpr (D == DType::BF16)
    return S::load_bf16(reinterpret_cast<const uint16_t*>(p));
  else
    return S::load_f16(reinterpret_cast<const uint16_t*>(p));
}

// The first n (< S::W) elements, the rest zero: f32 as load_part (masked where the ISA has it: the
// vision tower packs each key's last 8 of 72 values this way), 16-bit types through a buffer.
template <class S, DType D>
inline typename S::V load_w_part(const std::byte* p, size_t n) {
  if constexpr (D == DType::F32) {
    return load_part<S>(reinterpret_cast<const float*>(p), n);
  } else {
    alignas(64) std::byte tmp[S::W * 2] = {};
    std::memcpy(tmp, p, n * kElemSize<D>);
    return load_w<S, D>(tmp);
  }
}

// ---- small M: RM activation rows × RN weight rows, dot products over all of K ----
// Weight bytes asked for this far ahead of the loads (software prefetch).
inline constexpr size_t kTileAhead = 4096;

template <class S, DType D, int RM, int RN>
void dot_tile(const GemmArgs& a, size_t m0, size_t n0) {
  using V = typename S::V;
  constexpr size_t W = S::W, es = kElemSize<D>;
  V acc[RM][RN];
  VLM_UNROLL
  for (int m = 0; m < RM; ++m) {
    VLM_UNROLL
    for (int r = 0; r < RN; ++r) acc[m][r] = S::zero();
  }
  const std::byte* wr[RN];
  VLM_UNROLL
  for (int r = 0; r < RN; ++r) wr[r] = a.w + (n0 + r) * a.ldw_bytes;
  const float* xr[RM];
  VLM_UNROLL
  for (int m = 0; m < RM; ++m) xr[m] = a.x + (m0 + m) * a.ldx;
  size_t k = 0;
  for (; k + W <= a.K; k += W) {
    V wv[RN];
    VLM_UNROLL
    for (int r = 0; r < RN; ++r) {
      // RN rows are RN streams far apart, which the hardware prefetcher follows poorly.
      __builtin_prefetch(wr[r] + k * es + kTileAhead, 0, 3);
      wv[r] = load_w<S, D>(wr[r] + k * es);
    }
    VLM_UNROLL
    for (int m = 0; m < RM; ++m) {
      const V xv = S::load(xr[m] + k);
      VLM_UNROLL
      for (int r = 0; r < RN; ++r) acc[m][r] = S::fma(xv, wv[r], acc[m][r]);
    }
  }
  if (k < a.K) {
    const size_t n = a.K - k;
    V wv[RN];
    VLM_UNROLL
    for (int r = 0; r < RN; ++r) wv[r] = load_w_part<S, D>(wr[r] + k * es, n);
    VLM_UNROLL
    for (int m = 0; m < RM; ++m) {
      const V xv = load_part<S>(xr[m] + k, n);
      VLM_UNROLL
      for (int r = 0; r < RN; ++r) acc[m][r] = S::fma(xv, wv[r], acc[m][r]);
    }
  }
  VLM_UNROLL
  for (int m = 0; m < RM; ++m) {
    VLM_UNROLL
    for (int r = 0; r < RN; ++r) {
      float v = S::hsum(acc[m][r]);
      if (a.bias) v += a.bias[n0 + r];
      a.y[(m0 + m) * a.ldy + n0 + r] = v;
    }
  }
}

template <class S, DType D, int RM, int RN>
void dot_rows(const GemmArgs& a, size_t m0, size_t n0, size_t n1) {
  size_t n = n0;
  for (; n + RN <= n1; n += RN) dot_tile<S, D, RM, RN>(a, m0, n);
  for (; n < n1; ++n) dot_tile<S, D, RM, 1>(a, m0, n);
}

// Rows m .. m+rm (rm < RMAX) with the largest tile that fits.
template <class S, DType D, int RMAX>
void dot_rest(const GemmArgs& a, size_t m, size_t rm, size_t n0, size_t n1) {
  if constexpr (RMAX > 1) {
    if (rm == RMAX - 1) return dot_rows<S, D, RMAX - 1, S::DOT_RN2>(a, m, n0, n1);
    return dot_rest<S, D, RMAX - 1>(a, m, rm, n0, n1);
  }
}

// M = 1 (decode): kStreams rows at a time, one from each of kStreams equal parts of the
// thread's range, each asked for kRowAhead bytes ahead, so a thread keeps that many
// sequential streams in flight (docs/gguf.md, "Decode streams"; the AVX512-BF16 twin is
// dot_bf16_row1). Each x vector is loaded once for every stream.
template <class S, DType D>
float dot_one_row(const GemmArgs& a, const std::byte* wr, size_t k, typename S::V c0, typename S::V c1) {
  constexpr size_t W = S::W, es = kElemSize<D>;
  for (; k + W <= a.K; k += W) c0 = S::fma(S::load(a.x + k), load_w<S, D>(wr + k * es), c0);
  if (k < a.K) c1 = S::fma(load_part<S>(a.x + k, a.K - k), load_w_part<S, D>(wr + k * es, a.K - k), c1);
  return S::hsum(S::add(c0, c1));
}

// Rows n0 + j · part + i of R streams (the tail of a range: R = 1). A row's sums do not depend on
// R, so its output does not depend on how the rows were split into ranges (threads, matmul_each).
template <class S, DType D, int R>
void dot_row1_streams(const GemmArgs& a, size_t n0, size_t part, size_t i) {
  using V = typename S::V;
  constexpr size_t W = S::W, es = kElemSize<D>;
  // Vectors per stream per turn: a whole 64-byte line of weights where that is 2 to 4 vectors.
  constexpr size_t U = 64 / (W * es) < 2 ? 2 : 64 / (W * es) > 4 ? 4 : 64 / (W * es);
  const std::byte* wr[R];
  V c[R][2];
  VLM_UNROLL
  for (int j = 0; j < R; ++j) wr[j] = a.w + (n0 + j * part + i) * a.ldw_bytes, c[j][0] = c[j][1] = S::zero();
  size_t k = 0;
  for (; k + U * W <= a.K; k += U * W) {
    VLM_UNROLL
    for (int j = 0; j < R; ++j)
      for (size_t b = 0; b < U * W * es; b += 64) __builtin_prefetch(wr[j] + k * es + b + kRowAhead, 0, 3);
    VLM_UNROLL
    for (size_t u = 0; u < U; ++u) {
      const V xv = S::load(a.x + k + u * W);
      VLM_UNROLL
      for (int j = 0; j < R; ++j) c[j][u % 2] = S::fma(xv, load_w<S, D>(wr[j] + (k + u * W) * es), c[j][u % 2]);
    }
  }
  VLM_UNROLL
  for (int j = 0; j < R; ++j) {
    const size_t n = n0 + j * part + i;
    a.y[n] = dot_one_row<S, D>(a, wr[j], k, c[j][0], c[j][1]) + (a.bias ? a.bias[n] : 0.f);
  }
}

template <class S, DType D>
void dot_row1(const GemmArgs& a, size_t n0, size_t n1) {
  constexpr int kStreams = 4;
  const size_t part = (n1 - n0) / kStreams;
  for (size_t i = 0; i < part; ++i) dot_row1_streams<S, D, kStreams>(a, n0, part, i);
  for (size_t n = n0 + kStreams * part; n < n1; ++n) dot_row1_streams<S, D, 1>(a, n, 0, 0);
}

template <class S, DType D>
void dot_typed(const GemmArgs& a, size_t n0, size_t n1) {
  if (a.M == 1) return dot_row1<S, D>(a, n0, n1);
  // Every row group reads the same weights: take them in slices that stay in L2 (about
  // 128 KiB), so the weights come from memory once.
  const size_t bytes_per_row = a.K * kElemSize<D>;
  const size_t slice = bytes_per_row >= (size_t(128) << 10) ? 1 : (size_t(128) << 10) / bytes_per_row;
  for (size_t s = n0; s < n1; s += slice) {
    const size_t e = n1 - s < slice ? n1 : s + slice;
    size_t m = 0;
    for (; m + S::DOT_RM <= a.M; m += S::DOT_RM) dot_rows<S, D, S::DOT_RM, S::DOT_RN2>(a, m, s, e);
    if (m < a.M) dot_rest<S, D, S::DOT_RM>(a, m, a.M - m, s, e);
  }
}

// fn(std::integral_constant<int, RM>(), m0) for each group of up to four activation rows.
template <class Fn>
void row_groups(size_t M, Fn fn) {
  size_t m = 0;
  for (; m + 4 <= M; m += 4) fn(std::integral_constant<int, 4>(), m);
  switch (M - m) {
    case 3: fn(std::integral_constant<int, 3>(), m); break;
    case 2: fn(std::integral_constant<int, 2>(), m); break;
    case 1: fn(std::integral_constant<int, 1>(), m); break;
    default: break;
  }
}

// The sums of an RM × RN dot tile that covers columns [k0, k1) of K (the FMA twins' tiles
// take K in column blocks): they start at zero at k0 = 0, else from acc_mem, where they go back
// unless k1 = K; then they become y's entries for rows m0.. and weight rows n0 + r · stride.
template <class S, int RM, int RN>
inline void tile_start(typename S::V (&acc)[RM][RN], size_t k0, const typename S::V* acc_mem) {
  VLM_UNROLL
  for (int m = 0; m < RM; ++m) {
    VLM_UNROLL
    for (int r = 0; r < RN; ++r) acc[m][r] = k0 ? acc_mem[m * RN + r] : S::zero();
  }
}
template <class S, int RM, int RN>
inline void tile_finish(const GemmArgs& a, typename S::V (&acc)[RM][RN], size_t k1, size_t K, typename S::V* acc_mem,
                        size_t m0, size_t n0, size_t stride) {
  VLM_UNROLL
  for (int m = 0; m < RM; ++m) {
    VLM_UNROLL
    for (int r = 0; r < RN; ++r) {
      if (k1 < K) {
        acc_mem[m * RN + r] = acc[m][r];
        continue;
      }
      if (m0 + m >= a.M) break;  // a padding row (dot_bf16's last group)
      float v = S::hsum(acc[m][r]);
      if (a.bias) v += a.bias[n0 + r * stride];
      a.y[(m0 + m) * a.ldy + n0 + r * stride] = v;
    }
  }
}

// ---- packed path ----
// Packs W(n0 .. n0+cols, k0 .. k0+kc) as f32 [kc][NR] (columns beyond cols are zero).
template <class S, DType D>
void pack_panel(const GemmArgs& a, size_t n0, size_t cols, size_t k0, size_t kc, float* dst) {
  using V = typename S::V;
  constexpr size_t W = S::W, NR = S::W * S::NV, es = kElemSize<D>;
  if (a.kn) {
    for (size_t k = 0; k < kc; ++k) {
      const std::byte* src = a.w + (k0 + k) * a.ldw_bytes + n0 * es;
      for (size_t j = 0; j < NR; j += W) {
        V v = j + W <= cols ? load_w<S, D>(src + j * es)
                            : (j < cols ? load_w_part<S, D>(src + j * es, cols - j) : S::zero());
        S::store(dst + k * NR + j, v);
      }
    }
    return;
  }
  // nk layout: rows of W become columns of the panel, W×W blocks at a time.
  for (size_t g = 0; g < NR; g += W) {
    for (size_t k = 0; k < kc; k += W) {
      const size_t kn = kc - k < W ? kc - k : W;
      V blk[W];
      for (size_t i = 0; i < W; ++i) {
        if (g + i >= cols) {
          blk[i] = S::zero();
          continue;
        }
        const std::byte* src = a.w + (n0 + g + i) * a.ldw_bytes + (k0 + k) * es;
        // Rows are read in short runs that the hardware prefetcher misses: fetch the same run
        // of the row W on (the next group's, or the next panel's), one group ahead of its use.
        // (The same run of the next K block, fetched before, had left L2 by its turn.)
        __builtin_prefetch(src + W * a.ldw_bytes);
        blk[i] = kn == W ? load_w<S, D>(src) : load_w_part<S, D>(src, kn);
      }
      S::transpose(blk);
      for (size_t i = 0; i < kn; ++i) S::store(dst + (k + i) * NR + g, blk[i]);
    }
  }
}

// Writes a register tile to y (the first `cols` columns): y = acc (+ bias) for the first
// K block, y += acc for the others.
template <class S, int R, int NVv>
inline void store_tile(typename S::V (&acc)[R][NVv], float* y, size_t ldy, size_t cols, bool first,
                       const float* bias) {
  using V = typename S::V;
  constexpr size_t W = S::W;
  VLM_UNROLL
  for (int r = 0; r < R; ++r) {
    float* yr = y + r * ldy;
    VLM_UNROLL
    for (int v = 0; v < NVv; ++v) {
      const size_t j = size_t(v) * W;
      if (j >= cols) break;
      const size_t n = cols - j < W ? cols - j : W;
      V base;
      if (first)
        base = bias ? (n == W ? S::load(bias + j) : load_part<S>(bias + j, n)) : S::zero();
      else
        base = n == W ? S::load(yr + j) : load_part<S>(yr + j, n);
      const V out = S::add(base, acc[r][v]);
      if (n == W)
        S::store(yr + j, out);
      else
        store_part<S>(yr + j, out, n);
    }
  }
}

// acc = x[R rows, ldx apart] · b over kc, b's rows LDB floats apart; y's lines of the tile
// (R rows, ldy apart) asked for on the way.
template <class S, int R, int NVv, size_t LDB>
inline void accumulate(typename S::V (&acc)[R][NVv], size_t kc, const float* x, size_t ldx, const float* b,
                       const float* y, size_t ldy) {
  using V = typename S::V;
  constexpr size_t W = S::W;
  VLM_UNROLL
  for (int r = 0; r < R; ++r) {
    VLM_UNROLL
    for (int v = 0; v < NVv; ++v) acc[r][v] = S::zero();
  }
  // The tile's lines of y, asked for now and needed after the kc-long loop: where y outgrows the
  // caches (M = 4096 in the vision tower) each was a miss at the end of every tile, 10-25 % of
  // the GEMM's time on Zen 3.
  VLM_UNROLL
  for (int r = 0; r < R; ++r) {
    __builtin_prefetch(y + r * ldy, 1);
    __builtin_prefetch(y + r * ldy + NVv * W - 1, 1);
  }
  // One pointer per row and the loop unrolled by 4: with x + r·ldx + k per broadcast the loop
  // spent 5 address computations and 3 counter operations on 12 FMAs (GEMMs 1.06-1.18x on two
  // Zen 3 cores).
  const float* xr[R];
  VLM_UNROLL
  for (int r = 0; r < R; ++r) xr[r] = x + r * ldx;
#pragma GCC unroll 4
  for (size_t k = 0; k < kc; ++k) {
    V bv[NVv];
    VLM_UNROLL
    for (int v = 0; v < NVv; ++v) bv[v] = S::load(b + k * LDB + v * W);
    VLM_UNROLL
    for (int r = 0; r < R; ++r) {
      const V av = S::bcast(xr[r] + k);
      VLM_UNROLL
      for (int v = 0; v < NVv; ++v) acc[r][v] = S::fma(av, bv[v], acc[r][v]);
    }
  }
}

// One register tile: R rows × NVv vectors over kc, stored (first) or added into y; b's rows are
// LDB floats apart.
template <class S, int R, int NVv, size_t LDB = size_t(S::W) * S::NV>
void micro(const GemmArgs& a, size_t kc, const float* x, const float* b, float* y, size_t cols,
           bool first, const float* bias) {
  typename S::V acc[R][NVv];
  accumulate<S, R, NVv, LDB>(acc, kc, x, a.ldx, b, y, a.ldy);
  store_tile<S, R, NVv>(acc, y, a.ldy, cols, first, bias);
}

// attend's scores of R query rows against one whole key panel over all d: y = scale · q·kᵀ, and
// each row's running maximum (a vector, lanes maxed apart) raised by them.
template <class S, int R>
void scores_tile(const AttendArgs& a, const float* q, const float* keys, float* y, float* maxima) {
  using V = typename S::V;
  constexpr size_t W = S::W;
  V acc[R][S::NV];
  accumulate<S, R, S::NV, W * S::NV>(acc, a.d, q, a.ldq, keys, y, a.lds);
  const V sv = S::set1(a.scale);
  VLM_UNROLL
  for (int r = 0; r < R; ++r) {
    V mx = S::load(maxima + r * W);
    VLM_UNROLL
    for (int v = 0; v < S::NV; ++v) {
      const V u = S::mul(acc[r][v], sv);
      S::store(y + r * a.lds + v * W, u);
      mx = S::max(mx, u);
    }
    S::store(maxima + r * W, mx);
  }
}

template <class S, size_t... R>
constexpr auto scores_tiles(std::index_sequence<R...>) {
  using Fn = void (*)(const AttendArgs&, const float*, const float*, float*, float*);
  return std::array<Fn, sizeof...(R)>{&scores_tile<S, int(R) + 1>...};
}

template <class S>
using MicroFn = void (*)(const GemmArgs&, size_t, const float*, const float*, float*, size_t, bool,
                         const float*);

template <class S, int R, size_t... V>
constexpr void fill_row(MicroFn<S>* row, std::index_sequence<V...>) {
  ((row[V] = &micro<S, R, int(V) + 1>), ...);
}
template <class S, size_t... R>
constexpr void fill_table(MicroFn<S> (*t)[S::NV], std::index_sequence<R...>) {
  (fill_row<S, int(R) + 1>(t[R], std::make_index_sequence<S::NV>()), ...);
}

// The register tiles of every shape up to MR rows × NV vectors: f[rows − 1][vectors − 1].
template <class S>
struct RegisterTiles {
  MicroFn<S> f[S::MR][S::NV];
};
template <class S>
const RegisterTiles<S>& register_tiles() {
  static const RegisterTiles<S> table = [] {
    RegisterTiles<S> t{};
    fill_table<S>(t.f, std::make_index_sequence<S::MR>());
    return t;
  }();
  return table;
}

// The width of the panels nc columns split into: equal, in whole vectors, at most NR, so that 72
// columns become 48 + 24 rather than 64 + 8, whose one-vector tile would be latency-bound.
template <class S>
inline size_t panel_width(size_t nc) {
  constexpr size_t NR = S::W * S::NV;
  const size_t np = (nc + NR - 1) / NR;
  return ((nc + np - 1) / np + S::W - 1) / S::W * S::W;
}

template <class S, DType D>
void gemm_typed(const GemmArgs& a, size_t nb, size_t ne, size_t mb, size_t me, float* pack) {
  constexpr size_t NR = S::W * S::NV, MR = S::MR, MC = 8 * S::MR * 4;
  const RegisterTiles<S>& table = register_tiles<S>();
  const size_t step = column_block(ne - nb, NR);
  for (size_t n0 = nb; n0 < ne; n0 += step) {
    const size_t nc = ne - n0 < step ? ne - n0 : step;
    const size_t pw = panel_width<S>(nc);
    const size_t panels = (nc + pw - 1) / pw;
    for (size_t k0 = 0; k0 < a.K; k0 += kKC) {
      const size_t kc = a.K - k0 < kKC ? a.K - k0 : kKC;
      for (size_t p = 0; p < panels; ++p) {
        const size_t c = nc - p * pw < pw ? nc - p * pw : pw;
        pack_panel<S, D>(a, n0 + p * pw, c, k0, kc, pack + p * kKC * NR);
      }
      const float* bias = a.bias ? a.bias + n0 : nullptr;
      for (size_t m0 = mb; m0 < me; m0 += MC) {
        const size_t m1 = me - m0 < MC ? me : m0 + MC;
        for (size_t p = 0; p < panels; ++p) {
          const size_t c = nc - p * pw < pw ? nc - p * pw : pw;
          const size_t nv = (c + S::W - 1) / S::W;
          for (size_t m = m0; m < m1; m += MR) {
            const size_t r = m1 - m < MR ? m1 - m : MR;
            table.f[r - 1][nv - 1](a, kc, a.x + m * a.ldx + k0, pack + p * kKC * NR,
                                   a.y + m * a.ldy + n0 + p * pw, c, k0 == 0,
                                   bias ? bias + p * pw : nullptr);
          }
        }
      }
    }
  }
}

// ---- attention's products (matmul.h, attend) on the f32 register tiles. Keys pack as a [n, d]
// nk weight's panels ([d][NR] per NR keys, zero past n) and values as a [n, d] kn weight's
// ([n][NR] per panel_width of the d columns), once for every query row; the sums run in
// gemm_typed's order (K blocks of kKC).
//
// On AVX-512, values of 65–80 columns (SigLIP's heads of 72) are instead one panel of five vectors
// a key ([n][80]) for a tile of four rows, taken 128 keys at a time (40 KiB, in L1): two panels of
// 48 + 24 columns ran that product 1.15× slower (docs/gguf.md, "Which kernels a bf16 product takes").
template <class S>
inline constexpr bool kWideValues = S::W == 16 && S::NV == 4;  // the AVX-512 tiles
inline constexpr size_t kWideLd = 80, kWideKeys = 128;
template <class S>
inline bool wide_values(size_t d) {
  return kWideValues<S> && d > kWideLd - S::W && d <= kWideLd;
}

template <class S>
void pack_kv_f32(const float* k, const float* v, size_t ld, size_t n, size_t d, float* kp, float* vp) {
  constexpr size_t NR = S::W * S::NV;
  GemmArgs w{};
  w.dtype = DType::F32, w.ldw_bytes = ld * sizeof(float);
  w.w = reinterpret_cast<const std::byte*>(k);
  for (size_t p = 0; p * NR < n; ++p)
    pack_panel<S, DType::F32>(w, p * NR, n - p * NR < NR ? n - p * NR : NR, 0, d, kp + p * d * NR);
  if (wide_values<S>(d)) {
    for (size_t key = 0; key < n; ++key) {
      std::memcpy(vp + key * kWideLd, v + key * ld, d * sizeof(float));
      std::memset(vp + key * kWideLd + d, 0, (kWideLd - d) * sizeof(float));
    }
    return;
  }
  w.w = reinterpret_cast<const std::byte*>(v), w.kn = true;
  const size_t pw = panel_width<S>(d);
  for (size_t c = 0; c * pw < d; ++c)
    pack_panel<S, DType::F32>(w, c * pw, d - c * pw < pw ? d - c * pw : pw, 0, n, vp + c * n * NR);
}

template <class S>
void attend_f32(const AttendArgs& a) {
  constexpr size_t W = S::W, NR = S::W * S::NV, MR = S::MR;
  const RegisterTiles<S>& table = register_tiles<S>();
  // Scores over whole key panels [a0, a1), then the keys [k0, k1) of each row.
  const size_t a0 = a.k0 / NR * NR, a1 = (a.k1 + NR - 1) / NR * NR, n = a.k1 - a.k0, w = a.lds;
  float* scores = a.scratch;
  if (!a.mask && a.d <= kKC && a.k0 == a0 && a.k1 == a1) {
    // Unmasked whole panels in one K block (the vision tower): the tiles store the scaled scores
    // and keep each row's maximum, so the softmax skips its pass for them (the same values, so the
    // same bits).
    static constexpr auto tiles = scores_tiles<S>(std::make_index_sequence<MR>());
    static_assert(W <= kMaxLanes);
    float* maxima = a.scratch + a.rows * w;
    for (size_t i = 0; i < a.rows * W; ++i) maxima[i] = -INFINITY;
    for (size_t p = a0 / NR; p < a1 / NR; ++p)
      for (size_t m = 0; m < a.rows; m += MR)
        tiles[(a.rows - m < MR ? a.rows - m : MR) - 1](a, a.q + m * a.ldq, a.keys + p * a.d * NR,
                                                       scores + m * w + (p * NR - a0), maxima + m * W);
    for (size_t r = 0; r < a.rows; ++r)
      exp_normalize(scores + r * w, n, S::hmax(S::load(maxima + r * W)), a.round, a.isa);
  } else {
    GemmArgs qk{};
    qk.ldx = a.ldq, qk.ldy = w;
    for (size_t k0 = 0; k0 < a.d; k0 += kKC) {
      const size_t kc = a.d - k0 < kKC ? a.d - k0 : kKC;
      for (size_t p = a0 / NR; p < a1 / NR; ++p)
        for (size_t m = 0; m < a.rows; m += MR)
          table.f[(a.rows - m < MR ? a.rows - m : MR) - 1][S::NV - 1](
              qk, kc, a.q + m * a.ldq + k0, a.keys + (p * a.d + k0) * NR, scores + m * w + (p * NR - a0), NR,
              k0 == 0, nullptr);
    }
    for (size_t r = 0; r < a.rows; ++r)
      scaled_softmax(scores + r * w + (a.k0 - a0), n, a.scale, a.mask ? a.mask + r * a.ldm : nullptr, a.round,
                     a.isa);
  }
  // o = P·v, one panel of values and K block at a time, which stays in L1 across the rows.
  GemmArgs pv{};
  pv.ldx = w, pv.ldy = a.ldo;
  if constexpr (kWideValues<S>) {
    if (wide_values<S>(a.d)) {
      for (size_t kb = 0; kb < n; kb += kWideKeys) {
        const size_t kc = n - kb < kWideKeys ? n - kb : kWideKeys;
        const float* b = a.values + (a.k0 + kb) * kWideLd;
        for (size_t m = 0; m < a.rows; m += 4) {
          const float* x = scores + m * w + (a.k0 - a0) + kb;
          float* y = a.out + m * a.ldo;
          switch (a.rows - m < 4 ? a.rows - m : 4) {
            case 4: micro<S, 4, 5, kWideLd>(pv, kc, x, b, y, a.d, kb == 0, nullptr); break;
            case 3: micro<S, 3, 5, kWideLd>(pv, kc, x, b, y, a.d, kb == 0, nullptr); break;
            case 2: micro<S, 2, 5, kWideLd>(pv, kc, x, b, y, a.d, kb == 0, nullptr); break;
            default: micro<S, 1, 5, kWideLd>(pv, kc, x, b, y, a.d, kb == 0, nullptr); break;
          }
        }
      }
      return;
    }
  }
  const size_t pw = panel_width<S>(a.d);
  for (size_t c0 = 0; c0 < a.d; c0 += pw) {
    const size_t cols = a.d - c0 < pw ? a.d - c0 : pw, nv = (cols + W - 1) / W;
    const float* panel = a.values + c0 / pw * a.n * NR;
    for (size_t kb = 0; kb < n; kb += kKC) {
      const size_t kc = n - kb < kKC ? n - kb : kKC;
      for (size_t m = 0; m < a.rows; m += MR)
        table.f[(a.rows - m < MR ? a.rows - m : MR) - 1][nv - 1](
            pv, kc, scores + m * w + (a.k0 - a0) + kb, panel + (a.k0 + kb) * NR, a.out + m * a.ldo + c0, cols,
            kb == 0, nullptr);
    }
  }
}

// As many independent FMA chains as the GEMM tile keeps in registers; the result is
// bounded (a fixed point near 1000) and written to a volatile so nothing is elided.
template <class S>
double fma_loop(size_t iters) {
  using V = typename S::V;
  constexpr int N = S::MR * S::NV;
  alignas(64) float av[S::W], bv[S::W], init[N * S::W];
  for (int i = 0; i < S::W; ++i) av[i] = 0.999f, bv[i] = 1.f;
  // distinct starting values, or the compiler may merge identical chains
  for (int i = 0; i < N * S::W; ++i) init[i] = float(i);
  const V a = S::load(av), b = S::load(bv);
  V acc[N];
  VLM_UNROLL
  for (int i = 0; i < N; ++i) acc[i] = S::load(init + i * S::W);
  for (size_t it = 0; it < iters; ++it) {
    VLM_UNROLL
    for (int i = 0; i < N; ++i) acc[i] = S::fma(acc[i], a, b);
  }
  V s = acc[0];
  VLM_UNROLL
  for (int i = 1; i < N; ++i) s = S::add(s, acc[i]);
  volatile float sink = S::hsum(s);
  (void)sink;
  return 2.0 * double(iters) * N * S::W;
}

// Reads n floats (a multiple of 4 vectors) from each of `streams` streams `stride` floats apart,
// four vectors of each in turn: the bandwidth probe's loop, in the shapes the decode kernels
// read (dot_bf16_row1: four streams in lockstep).
template <class S>
float read_loop(const float* p, size_t n, size_t streams, size_t stride) {
  using V = typename S::V;
  constexpr size_t W = S::W;
  V s0 = S::zero(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i + 4 * W <= n; i += 4 * W)
    for (size_t j = 0; j < streams; ++j) {
      const float* q = p + j * stride + i;
      s0 = S::add(s0, S::load(q));
      s1 = S::add(s1, S::load(q + W));
      s2 = S::add(s2, S::load(q + 2 * W));
      s3 = S::add(s3, S::load(q + 3 * W));
    }
  return S::hsum(S::add(S::add(s0, s1), S::add(s2, s3)));
}

// The ISA's own kernels for D (dot, gemm) beside `native`'s (the AVX512-BF16 and AMX kernels, and
// AVX2's FMA twin).
template <class S, DType D>
constexpr FormatKernels format_kernels(FormatKernels native = {}) {
  native.dot = &dot_typed<S, D>;
  native.gemm = &gemm_typed<S, D>;
  return native;
}

template <class S>
constexpr IsaKernels make_kernels(const char* name, FormatKernels f16 = {}, FormatKernels bf16 = {}) {
  return IsaKernels{name,
                    format_kernels<S, DType::F32>(),
                    format_kernels<S, DType::F16>(f16),
                    format_kernels<S, DType::BF16>(bf16),
                    S::W * S::NV,
                    S::MR,
                    2 * kNC * kKC,
                    &fma_loop<S>,
                    &read_loop<S>,
                    &pack_kv_f32<S>,
                    &attend_f32<S>};
}

}  // namespace vlm::kernels::detail
