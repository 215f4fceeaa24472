// AVX-512 (F/BW/VL/DQ) matmul kernels: 16 floats per vector, 6×64 register tiles; and
// the opt-in AVX512-BF16 path (vdpbf16ps on bf16 pairs) for bf16 weights.
#include "kernels/matmul_impl.h"
#include "kernels/simd_avx512.h"

namespace vlm::kernels::detail {
namespace {

// bf16-dot blocking: K in pairs (one 32-bit word holds two bf16), so a K block of 256
// keeps the packed micro-panel (128 words × 64 columns) at 32 KiB, in L1.
constexpr size_t kKCb = 256, kMCb = 192, kNR = 64, kMR = 6;

// Packs W(n0 .. n0+cols, k0 .. k0+kc) of a bf16 nk weight as words [kc/2][64]: word
// (p, j) holds W(n0+j, k0+2p) in its low half and W(n0+j, k0+2p+1) in its high half.
void pack_b_pairs(const GemmArgs& a, size_t n0, size_t cols, size_t k0, size_t kc, uint32_t* dst) {
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
      S512::transpose(blk);  // 32-bit words: rows of W become columns
      const size_t np = kp - p < 16 ? kp - p : 16;
      for (size_t i = 0; i < np; ++i) _mm512_storeu_ps(reinterpret_cast<float*>(dst + (p + i) * kNR + g), blk[i]);
    }
}

// x rows m0..m1, columns k0..k0+kc, rounded to bf16 (nearest even) as words [m][kc/2].
void pack_a_pairs(const GemmArgs& a, size_t m0, size_t m1, size_t k0, size_t kc, uint32_t* dst) {
  const size_t kp = (kc + 1) / 2;
  for (size_t m = m0; m < m1; ++m) {
    const float* src = a.x + m * a.ldx + k0;
    uint32_t* d = dst + (m - m0) * kp;
    size_t k = 0;
    for (; k + 32 <= kc; k += 32) {
      const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + k + 16), _mm512_loadu_ps(src + k));
      _mm512_storeu_si512(d + k / 2, reinterpret_cast<const __m512i&>(h));
    }
    if (k < kc) {
      alignas(64) float tmp[32] = {};
      std::memcpy(tmp, src + k, (kc - k) * 4);
      const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_load_ps(tmp + 16), _mm512_load_ps(tmp));
      alignas(64) uint32_t words[16];
      _mm512_store_si512(words, reinterpret_cast<const __m512i&>(h));
      std::memcpy(d + k / 2, words, (kp - k / 2) * 4);
    }
  }
}

template <int R, int NVv>
void micro_bf16(size_t kp, const uint32_t* A, size_t lda, const uint32_t* B, float* y, size_t ldy,
                size_t cols, bool first, const float* bias) {
  __m512 acc[R][NVv];
  VLM_UNROLL
  for (int r = 0; r < R; ++r) {
    VLM_UNROLL
    for (int v = 0; v < NVv; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  for (size_t p = 0; p < kp; ++p) {
    __m512bh bv[NVv];
    VLM_UNROLL
    for (int v = 0; v < NVv; ++v) {
      const __m512i w = _mm512_loadu_si512(B + p * kNR + v * 16);
      bv[v] = reinterpret_cast<const __m512bh&>(w);
    }
    VLM_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m512i x = _mm512_set1_epi32(int(A[r * lda + p]));
      const __m512bh av = reinterpret_cast<const __m512bh&>(x);
      VLM_UNROLL
      for (int v = 0; v < NVv; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
  store_tile<S512, R, NVv>(acc, y, ldy, cols, first, bias);
}

using MicroBf16 = void (*)(size_t, const uint32_t*, size_t, const uint32_t*, float*, size_t, size_t,
                           bool, const float*);

template <int R, size_t... V>
constexpr void fill_row_bf16(MicroBf16* row, std::index_sequence<V...>) {
  ((row[V] = &micro_bf16<R, int(V) + 1>), ...);
}
template <size_t... R>
constexpr void fill_table_bf16(MicroBf16 (*t)[4], std::index_sequence<R...>) {
  (fill_row_bf16<int(R) + 1>(t[R], std::make_index_sequence<4>()), ...);
}

void gemm_bf16dot(const GemmArgs& a, size_t nb, size_t ne, size_t mb, size_t me, float* pack) {
  static const auto table = [] {
    struct T {
      MicroBf16 f[kMR][4];
    } t{};
    fill_table_bf16(t.f, std::make_index_sequence<kMR>());
    return t;
  }();
  auto* bpack = reinterpret_cast<uint32_t*>(pack);      // kNC × kKCb/2 words
  uint32_t* apack = bpack + kNC * (kKCb / 2);          // kMCb × kKCb/2 words
  static_assert(kNC * (kKCb / 2) + kMCb * (kKCb / 2) <= 2 * kNC * kKC, "pack buffer too small");
  constexpr size_t panel_words = kKCb / 2 * kNR;
  const size_t step = column_block(ne - nb, kNR);
  for (size_t n0 = nb; n0 < ne; n0 += step) {
    const size_t nc = ne - n0 < step ? ne - n0 : step;
    const size_t panels = (nc + kNR - 1) / kNR;
    for (size_t k0 = 0; k0 < a.K; k0 += kKCb) {
      const size_t kc = a.K - k0 < kKCb ? a.K - k0 : kKCb, kp = (kc + 1) / 2;
      for (size_t p = 0; p < panels; ++p) {
        const size_t c = nc - p * kNR < kNR ? nc - p * kNR : kNR;
        pack_b_pairs(a, n0 + p * kNR, c, k0, kc, bpack + p * panel_words);
      }
      const float* bias = a.bias ? a.bias + n0 : nullptr;
      for (size_t m0 = mb; m0 < me; m0 += kMCb) {
        const size_t m1 = me - m0 < kMCb ? me : m0 + kMCb;
        pack_a_pairs(a, m0, m1, k0, kc, apack);
        for (size_t p = 0; p < panels; ++p) {
          const size_t c = nc - p * kNR < kNR ? nc - p * kNR : kNR;
          const size_t nv = (c + 15) / 16;
          for (size_t m = m0; m < m1; m += kMR) {
            const size_t r = m1 - m < kMR ? m1 - m : kMR;
            table.f[r - 1][nv - 1](kp, apack + (m - m0) * kp, kp, bpack + p * panel_words,
                                   a.y + m * a.ldy + n0 + p * kNR, a.ldy, c, k0 == 0,
                                   bias ? bias + p * kNR : nullptr);
          }
        }
      }
    }
  }
}

}  // namespace

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

const IsaKernels kAvx512Kernels = make_kernels<S512>("avx512", &gemm_bf16dot);

}  // namespace vlm::kernels::detail
