// The ops of ops.h for avx2 (templates in ops_impl.h).
#include "kernels/ops_impl.h"
#include "kernels/simd_avx2.h"

namespace vlm::kernels::detail {

const OpsKernels kAvx2Ops = make_ops<S256>();

}  // namespace vlm::kernels::detail
