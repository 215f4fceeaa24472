// Matrix products against stored weights. Activations are f32; weights stay in
// their stored dtype (f32, f16, bf16) and are converted on the fly.
// matmul() dispatches at run time to the best ISA path; matmul_ref() is the
// plain path that tests compare against.
#pragma once
#include <cstddef>

#include "core/dtype.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace vlm::kernels {

// A row-major weight matrix [rows = N outputs, cols = K inputs] (nn.Linear layout).
struct Weight {
  const std::byte* data = nullptr;
  DType dtype = DType::F32;
  size_t rows = 0, cols = 0;
};
// A 2-D tensor view as a Weight; throws if it is not 2-D.
Weight as_weight(const TensorView& t);

// y[M, N] = x[M, K] · Wᵀ, with K = w.cols and N = w.rows. y is overwritten.
void matmul(const float* x, size_t M, const Weight& w, float* y, ThreadPool& pool);
void matmul_ref(const float* x, size_t M, const Weight& w, float* y);

// Name of the ISA path matmul() uses on this CPU ("avx512bf16", "avx2", "scalar").
const char* matmul_isa();

}  // namespace vlm::kernels
