// AVX512-VNNI block-quant dot products: u8·s8 groups of four summed into int32 by one
// vpdpbusd (256-bit form, AVX512VL). Only used where CPUID reports AVX512_VNNI
// (quant_vnni_supported); the attribute adds VNNI to the file's AVX512 flags.
#include <immintrin.h>

#define QTARGET __attribute__((target("avx512vnni,avx512vl,avx512bw,avx512f,avx2,fma,f16c")))
namespace vlm::kernels::detail {
namespace {
constexpr bool kZmm = true;  // quant_impl.h: the K-quants' sub-blocks two at a time in 512-bit registers
QTARGET inline __m256i dot_u8s8(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }
// One block of 32 signed activation bytes against signed weight bytes: vpdpbusd of the
// weights as unsigned w + 128 (w xor 0x80) from a start of −128 · Σ x per group of four,
// which leaves Σ w · x per group exactly: one operation per weight block in place of the
// two sign moves, the start computed once per x block for every weight row it meets.
struct XBlock {
  __m256i x, start;
  QTARGET explicit XBlock(__m256i xq)
      : x(xq),
        start(_mm256_sub_epi32(_mm256_setzero_si256(),
                               _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(char(0x80)), xq))) {}
  QTARGET __m256i dot(__m256i w) const {
    return _mm256_dpbusd_epi32(start, _mm256_xor_si256(w, _mm256_set1_epi8(char(0x80))), x);
  }
};
}  // namespace
}  // namespace vlm::kernels::detail
#include "kernels/quant_impl.h"

namespace vlm::kernels::detail {
const QuantKernels kQuantAvx512 = make_quant_kernels();
}  // namespace vlm::kernels::detail
