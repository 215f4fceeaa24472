// Internal interface between the matmul dispatcher (matmul.cpp, baseline ISA) and
// the per-ISA kernel files. The ISA files expose only plain function pointers, so no
// inline library code compiled for a wider ISA can leak into baseline code.
#pragma once
#include <cstddef>

#include "core/dtype.h"
#include "kernels/matmul.h"

namespace vlm::kernels::detail {

// y[m, n] (+)= sum_k x[m, k] · W(n, k) over m in [0, M), n in [0, N).
// W(n, k) is w[n·ldw + k] (nk layout, nn.Linear) or w[k·ldw + n] (kn layout).
struct GemmArgs {
  const float* x;
  size_t ldx, M;
  const std::byte* w;
  DType dtype;
  size_t ldw;
  bool kn;
  size_t K, N;
  const float* bias;  // N entries or nullptr
  float* y;
  size_t ldy;
};

struct IsaKernels {
  const char* name;
  // Small M (nk layout only): y[:, n0:n1] by dot products, weights streamed once.
  void (*dot)(const GemmArgs&, size_t n0, size_t n1);
  // Packed, register-tiled product for y[m0:m1, n0:n1]; pack holds pack_floats floats
  // (64-byte aligned). n0 is a multiple of panel.
  void (*gemm)(const GemmArgs&, size_t n0, size_t n1, size_t m0, size_t m1, float* pack);
  // Optional (AVX512-BF16): the same for bf16 nk weights with x rounded to bf16 and
  // vdpbf16ps products; nullptr where the ISA has none.
  void (*gemm_bf16dot)(const GemmArgs&, size_t n0, size_t n1, size_t m0, size_t m1, float* pack);
  size_t panel;        // output columns per packed panel
  size_t row_tile;     // rows per register tile
  size_t pack_floats;  // scratch size for gemm
  // A register-resident FMA loop (the roofline's compute peak); returns FLOPs done.
  double (*fma_loop)(size_t iters);
};

extern const IsaKernels kScalarKernels;
extern const IsaKernels kAvx2Kernels;
extern const IsaKernels kAvx512Kernels;
const IsaKernels& kernels_for(Isa isa);

}  // namespace vlm::kernels::detail
