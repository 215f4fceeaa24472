// AVX2 + FMA + F16C matmul kernels: 8 floats per vector, 6×16 register tiles.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/matmul_impl.h"
#include "kernels/simd_avx2.h"

namespace vlm::kernels::detail {
namespace {

// ---- bf16 weights, 2..32 activation rows (FormatKernels::dot_bf16_fma): x rounded to bf16 as
// f32 in a.xq (wide_x in matmul.cpp: each 32-value group's 16 even entries, then its 16 odd ones),
// so 16 bf16 weights widen in two operations, one per half of each 32-bit pair (the generic tile
// spends two per 8). The products are the generic path's; only the summation order differs.

// The 32 bf16 values at p, those outside [lo, hi) zero (nothing outside them is read).
struct Group {
  alignas(32) uint16_t v[32] = {};
  void fill(const std::byte* p, size_t lo, size_t hi) { std::memcpy(v + lo, p + 2 * lo, 2 * (hi - lo)); }
};

// RM activation rows from m0 × the RN weight rows at wr over columns [k0, k1) of K (K counts
// `shift` zeros before each row, fma_dot_shift). The sums start at zero when k0 = 0, else from
// acc_mem; they go back there unless k1 = K, where they become y's entries for rows n0 + r · stride.
template <int RM, int RN>
void wide_tile(const GemmArgs& a, size_t m0, const std::byte* const* wr, size_t n0, size_t stride, size_t k0,
               size_t k1, size_t K, size_t shift, __m256* acc_mem) {
  __m256 acc[RM][RN];
  tile_start<S256>(acc, k0, acc_mem);
  const __m256i odd = _mm256_set1_epi32(int(0xffff0000u));
  // One group of 32 columns from k; w(r) gives row r's 64 bytes of it. Each half of 16 values
  // goes by parity: the RN rows' even entries meet every activation row, then their odd ones,
  // so each x vector is loaded once per RN weight rows (RM · RN sums + RN weights + one x
  // vector fill the 16 registers).
  auto step = [&](size_t k, auto w) {
    VLM_UNROLL
    for (int h = 0; h < 2; ++h) {
      VLM_UNROLL
      for (int p = 0; p < 2; ++p) {
        __m256 wv[RN];
        VLM_UNROLL
        for (int r = 0; r < RN; ++r) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w(r) + 32 * h));
          wv[r] = _mm256_castsi256_ps(p ? _mm256_and_si256(v, odd) : _mm256_slli_epi32(v, 16));
        }
        VLM_UNROLL
        for (int m = 0; m < RM; ++m) {
          const __m256 xv = _mm256_load_ps(reinterpret_cast<const float*>(a.xq + (m0 + m) * a.ldxq) + k + 16 * p + 8 * h);
          VLM_UNROLL
          for (int r = 0; r < RN; ++r) acc[m][r] = _mm256_fmadd_ps(xv, wv[r], acc[m][r]);
        }
      }
    }
  };
  size_t k = k0;
  if (k == 0 && shift) {  // the head of group 0 is not the row's
    Group g[RN];
    VLM_UNROLL
    for (int r = 0; r < RN; ++r) g[r].fill(wr[r], shift, std::min<size_t>(32, k1));
    step(k, [&](int r) { return reinterpret_cast<const std::byte*>(g[r].v); });
    k = 32;
  }
  for (; k + 32 <= k1; k += 32) {
    VLM_UNROLL
    for (int r = 0; r < RN; ++r) __builtin_prefetch(wr[r] + 2 * k + kRowAhead, 0, 3);  // RN streams far apart
    step(k, [&](int r) { return wr[r] + 2 * k; });
  }
  if (k < k1) {
    Group g[RN];
    VLM_UNROLL
    for (int r = 0; r < RN; ++r) g[r].fill(wr[r] + 2 * k, 0, k1 - k);
    step(k, [&](int r) { return reinterpret_cast<const std::byte*>(g[r].v); });
  }
  tile_finish<S256>(a, acc, k1, K, acc_mem, m0, n0, stride);
}

// Columns per pass: the RN weight rows' piece stays in L1, and the activation rows' piece (8 rows:
// 16 KiB) in L1 or L2, while every group of four rows meets them. 512 against 256: one thread
// 1.05-1.11x at M = 4-32 (weights in L3), two threads 1.06x at M = 8 streamed; 1024 was 0.95x.
constexpr size_t kWideBlock = 512;

// Every activation row × the RN weight rows n0, n0 + stride, …
template <int RN>
void wide_rows(const GemmArgs& a, size_t n0, size_t stride) {
  alignas(32) __m256 acc[32 / 4][4 * RN];  // the sums of each group between column blocks
  const size_t shift = fma_dot_shift(a), K = a.K + shift;
  const std::byte* wr[RN];
  VLM_UNROLL
  for (int r = 0; r < RN; ++r) wr[r] = a.w + (n0 + r * stride) * a.ldw_bytes - 2 * shift;
  for (size_t k0 = 0; k0 < K; k0 += kWideBlock) {
    const size_t k1 = std::min(K, k0 + kWideBlock);
    row_groups(a.M, [&](auto rm, size_t m) { wide_tile<rm, RN>(a, m, wr, n0, stride, k0, k1, K, shift, acc[m / 4]); });
  }
}

// kStreams weight rows at a time, one from each of kStreams parts of the range, as at M = 1.
void dot_bf16_fma(const GemmArgs& a, size_t n0, size_t n1) {
  constexpr int kStreams = 3;
  const size_t part = (n1 - n0) / kStreams;
  for (size_t i = 0; i < part; ++i) wide_rows<kStreams>(a, n0 + i, part);
  for (size_t n = n0 + kStreams * part; n < n1; ++n) wide_rows<1>(a, n, 1);
}

}  // namespace

const IsaKernels kAvx2Kernels = make_kernels<S256>("avx2", {}, {.dot_bf16_fma = &dot_bf16_fma});

}  // namespace vlm::kernels::detail
