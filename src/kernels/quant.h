// ggml block-quantized weights (Q8_0, Q4_0, Q4_K, Q6_K) and the GGUF float types.
//
// dequantize_row() is bit-exact to ggml's dequantize_row_* (the same f32 operations in the
// same order; docs/gguf.md gives each block layout). quant_matmul() works on the blocks
// directly, the way ggml's vec_dot does: the activations are quantized per 32 values to
// int8 with one f32 scale (QBlock8), and each weight block meets its activation block in an
// integer dot product; the f32 scales are applied per block (per 16 or 32 values for the
// K-quants' sub-block scales). Its error against dequantize-then-f32 is therefore the
// activation rounding, at most Σ_blocks |w|·d_x/2 per output (d_x = amax/127 of the block).
#pragma once
#include <cstddef>
#include <cstdint>

#include "io/gguf.h"
#include "kernels/exec.h"

namespace vlm::kernels {

// Bytes of one row of `cols` values; cols must be a multiple of the type's block.
size_t quant_row_bytes(GgmlType t, size_t cols);

// n values (a multiple of the block size) from `src` blocks into dst.
void dequantize_row(GgmlType t, const std::byte* src, float* dst, size_t n);

// 32 activations as int8 with scale d (value ≈ d·q), and the sums of q over each half
// (the offset formats subtract offset·Σq; Q6_K's sub-blocks are 16 long).
struct QBlock8 {
  float d;
  int16_t sum[2];
  int8_t q[32];
};
// K a multiple of 32: d = amax/127, q = round-half-away(x/d) (ggml's quantize_row_q8_0).
void quantize_activations(const float* x, size_t K, QBlock8* out);

// A quantized weight [rows = N outputs, cols = K inputs], rows stored back to back.
struct QuantWeight {
  const std::byte* data = nullptr;
  GgmlType type = GgmlType::Q8_0;
  size_t rows = 0, cols = 0;
};

// y[M, N] = x[M, K] · Wᵀ with integer block dot products, rows of W split over exec's pool;
// exec.isa picks the path (Avx512 needs AVX512-VNNI as well; exec.precision does not apply:
// the activations are always int8 per block). Only Q8_0, Q4_0, Q4_K and Q6_K are accepted.
void quant_matmul(const float* x, size_t M, const QuantWeight& w, float* y, const Exec& exec);
bool quant_isa_supported(Isa isa);

namespace detail {
// The per-ISA row kernels: y[m·ldy + n] for n in [n0, n1), all m < M.
using QuantRowsFn = void (*)(const QuantWeight& w, const QBlock8* act, size_t M, size_t n0, size_t n1, float* y,
                             size_t ldy);
extern const QuantRowsFn kQuantRowsScalar, kQuantRowsAvx2, kQuantRowsAvx512;
}  // namespace detail

}  // namespace vlm::kernels
