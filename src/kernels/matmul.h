// Matrix products against stored weights. Activations are f32; weights stay in
// their stored dtype (f32, f16, bf16) and are converted on the fly (exactly: the
// products and sums are f32, only the summation order differs from matmul_ref).
// Each call runs as its Exec says (threads, ISA path, precision; see exec.h); a plain
// ThreadPool& means the best ISA at f32. matmul_ref() is the plain path that tests
// compare against.
#pragma once
#include <cstddef>

#include "core/dtype.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/exec.h"

namespace vlm::kernels {

// A row-major weight matrix [rows, cols]; for matmul() rows = N outputs and cols =
// K inputs (nn.Linear layout). ld is the stored row stride in elements (0: cols), so a
// view of some columns of a wider matrix (one attention head) is a Weight too.
struct Weight {
  const std::byte* data = nullptr;
  DType dtype = DType::F32;
  size_t rows = 0, cols = 0;
  size_t ld = 0;
  size_t stride() const { return ld ? ld : cols; }
};
// A 2-D tensor view as a Weight; throws if it is not 2-D.
Weight as_weight(const TensorView& t);
// An f32 buffer [rows, cols] with row stride ld (0: cols) as a Weight.
Weight f32_weight(const float* data, size_t rows, size_t cols, size_t ld = 0);

// y[M, N] = x[M, K] · Wᵀ, with K = w.cols and N = w.rows. y is overwritten.
void matmul(const float* x, size_t M, const Weight& w, float* y, const Exec& ex);
// The plain loop the tests compare against; with Precision::Bf16 it rounds each x to bf16.
void matmul_ref(const float* x, size_t M, const Weight& w, float* y,
                Precision precision = Precision::F32);

// y[M, N] = x[M, K] · Wᵀ + bias (bias has N entries).
void matmul_bias(const float* x, size_t M, const Weight& w, const float* bias, float* y,
                 const Exec& ex);

// y[M, N] = x[M, K] · W with W stored [K, N] (in → out orientation, e.g. the Gemma 3
// projector's mm_input_projection_weight): K = w.rows, N = w.cols.
void matmul_kn(const float* x, size_t M, const Weight& w, float* y, const Exec& ex);

// The general form behind the ones above: x rows at stride ldx, y rows at stride ldy
// (elements), w in NK ([N, K], nn.Linear) or KN ([K, N]) layout, bias optional.
enum class Layout { NK, KN };
void matmul_strided(const float* x, size_t ldx, size_t M, const Weight& w, Layout layout,
                    const float* bias, float* y, size_t ldy, const Exec& ex);

}  // namespace vlm::kernels
