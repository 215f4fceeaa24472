// AVX512-VNNI block-quant dot products: u8·s8 groups of four summed into int32 by one
// vpdpbusd (256-bit form, AVX512VL). Only used where CPUID reports AVX512_VNNI
// (quant_vnni_supported); the attribute adds VNNI to the file's AVX512 flags.
#include <immintrin.h>

#define QTARGET __attribute__((target("avx512vnni,avx512vl,avx512bw,avx512f,avx2,fma,f16c")))
namespace vlm::kernels::detail {
namespace {
QTARGET inline __m256i dot_u8s8(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }
}  // namespace
}  // namespace vlm::kernels::detail
#include "kernels/quant_impl.h"

namespace vlm::kernels::detail {
const QuantKernels kQuantAvx512 = make_quant_kernels();
}  // namespace vlm::kernels::detail
