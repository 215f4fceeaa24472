// AVX2 + FMA + F16C matmul kernels: 8 floats per vector, 6×16 register tiles.
#include "kernels/matmul_impl.h"
#include "kernels/simd_avx2.h"

namespace vlm::kernels::detail {

const IsaKernels kAvx2Kernels = make_kernels<S256>("avx2");

}  // namespace vlm::kernels::detail
