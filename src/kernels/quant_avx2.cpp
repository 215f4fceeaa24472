// AVX2 block-quant dot products: u8·s8 pairs by vpmaddubsw, then vpmaddwd to int32.
#include <immintrin.h>

#define QTARGET
namespace vlm::kernels::detail {
namespace {
constexpr bool kZmm = false;  // quant_impl.h: no 512-bit K-quant loop
inline __m256i dot_u8s8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
// One block of 32 signed activation bytes against signed weight bytes: |w| · (x with w's
// sign), as vpmaddubsw's int16 pair sums stay below 2·128·127 only for |w| ≤ 128.
struct XBlock {
  __m256i x;
  explicit XBlock(__m256i xq) : x(xq) {}
  __m256i dot(__m256i w) const { return dot_u8s8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)); }
};
}  // namespace
}  // namespace vlm::kernels::detail
#include "kernels/quant_impl.h"

namespace vlm::kernels::detail {
const QuantKernels kQuantAvx2 = make_quant_kernels();
}  // namespace vlm::kernels::detail
