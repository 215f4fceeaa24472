// The ops of ops.h for avx512 (templates in ops_impl.h).
#include "kernels/ops_impl.h"
#include "kernels/simd_avx512.h"

namespace vlm::kernels::detail {

const OpsKernels kAvx512Ops = make_ops<S512>();

}  // namespace vlm::kernels::detail
