// AVX-512 (F/BW/VL/DQ) matmul kernels: 16 floats per vector, 6×64 register tiles.
#include "kernels/matmul_impl.h"
#include "kernels/simd_avx512.h"

namespace vlm::kernels::detail {

const IsaKernels kAvx512Kernels = make_kernels<S512>("avx512");

}  // namespace vlm::kernels::detail
