#include "kernels/matmul.h"

#include <cstring>

#include "core/error.h"

namespace vlm::kernels {

Weight as_weight(const TensorView& t) {
  if (t.shape.size() != 2) fail("tensor {} is not 2-D", t.name);
  return Weight{t.data, t.dtype, size_t(t.shape[0]), size_t(t.shape[1])};
}

namespace {
float load(const std::byte* p, DType t, size_t i) {
  uint16_t h;
  switch (t) {
    case DType::F32: {
      float v;
      std::memcpy(&v, p + 4 * i, 4);
      return v;
    }
    case DType::F16: std::memcpy(&h, p + 2 * i, 2); return f16_to_f32(h);
    case DType::BF16: std::memcpy(&h, p + 2 * i, 2); return bf16_to_f32(h);
  }
  return 0.f;
}

void ref_rows(const float* x, size_t M, const Weight& w, float* y, size_t n0, size_t n1) {
  const size_t K = w.cols, N = w.rows;
  for (size_t n = n0; n < n1; ++n) {
    const std::byte* row = w.data + n * K * dtype_size(w.dtype);
    for (size_t m = 0; m < M; ++m) {
      const float* xm = x + m * K;
      float acc = 0.f;
      for (size_t k = 0; k < K; ++k) acc += xm[k] * load(row, w.dtype, k);
      y[m * N + n] = acc;
    }
  }
}
}  // namespace

void matmul_ref(const float* x, size_t M, const Weight& w, float* y) { ref_rows(x, M, w, y, 0, w.rows); }

void matmul(const float* x, size_t M, const Weight& w, float* y, ThreadPool& pool) {
  pool.parallel_for(w.rows, [&](size_t n0, size_t n1) { ref_rows(x, M, w, y, n0, n1); });
}

const char* matmul_isa() { return "scalar"; }

}  // namespace vlm::kernels
