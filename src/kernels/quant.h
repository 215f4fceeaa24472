// ggml block-quantized weights (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL,
// IQ4_XS) and the GGUF float types.
//
// dequantize_row() is bit-exact to ggml's dequantize_row_* (the same f32 operations in the
// same order; docs/gguf.md gives each block layout). The formats are rows of the weight-format
// table (format.h: DType::Q8_0 ...), so kernels::matmul() runs them; its dot kernels work on
// the blocks directly, the way ggml's vec_dot does with its vec_dot_type: the activations are
// quantized to int8 with one f32 scale per block (Q8_0, Q4_0: per 32 values, a Q8Row; the
// K-quants: per 256, a Q8KRow, ggml's Q8_K), and each weight block meets its activation block
// in an integer dot product, the K-quants' sub-block scales applied in int32 and the f32 scales
// once per block. Its error against dequantize-then-f32 is therefore the activation rounding,
// at most Σ|w|·d_x/2 per output (d_x = amax/127 of the value's activation block).
#pragma once
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "core/dtype.h"
#include "io/gguf.h"
#include "kernels/exec.h"
#include "kernels/format.h"

namespace vlm::kernels {

// Bytes of one row of `cols` values; cols must be a multiple of the type's block.
size_t quant_row_bytes(GgmlType t, size_t cols);

// n values (a multiple of the block size) from `src` blocks into dst.
void dequantize_row(GgmlType t, const std::byte* src, float* dst, size_t n);

// n values (a multiple of the block size) of x into `dst` blocks of type t. Q8_0, Q4_0, Q4_1,
// Q5_0 and Q5_1 follow ggml's reference quantizers (quantize_row_q8_0_ref: d = amax/127, round
// half away; quantize_row_q4_0_ref / _q5_0_ref: the value of largest magnitude, sign kept, maps
// to −8 / −16; quantize_row_q4_1_ref / _q5_1_ref: [min, max] in 15 / 31 steps). IQ4_NL and
// IQ4_XS map each (sub-)block's value of largest magnitude to the codebook's −127. The K-quants
// fit each sub-block's scale (and the min of Q2_K, Q4_K and Q5_K) from its range, then the
// super-block's f16 scales from those (not ggml's iterative search: valid blocks, more error).
// F32/F16/BF16 round to nearest even.
void quantize_row(GgmlType t, const float* x, std::byte* dst, size_t n);

// One activation row of K values (K a multiple of 32) quantized per 32 values, as a Q8Act row
// holds it in K/32·kQ8BlockBytes bytes: the int8 codes q[32·i + j] first (they start where the
// row starts: matmul() puts rows on 64-byte lines), then the scales d[i] (value ≈ d[i]·q),
// apart from the codes so the scales of consecutive blocks load as one vector.
inline constexpr size_t kQ8BlockBytes = 32 + 4;
struct Q8Row {
  const float* d;
  const int8_t* q;
};
inline Q8Row q8_row(const std::byte* p, size_t K) {
  return {reinterpret_cast<const float*>(p + K), reinterpret_cast<const int8_t*>(p)};
}
// d = amax/127, q = round-half-away(x/d) (ggml's quantize_row_q8_0); writes a Q8Row's bytes.
void quantize_activations(const float* x, std::byte* out, size_t K);

// One activation row of K values (K a multiple of 256) quantized per 256 values, the way ggml's
// Q8_K holds them (block_q8_K: d, the 256 codes, the codes' sums per 16), in K/256·kQ8KBlockBytes
// bytes: the int8 codes q[256·i + j] first (so they start where the row starts: matmul() puts
// rows on 64-byte lines), then the scales d[i], then the sums bsums[16·i + j] of codes
// 16j..16j+15 of block i (int16: at most 16·127). The K-quants' kernels take it: their sub-block
// scales then multiply integer sums, and the min (Q4_K) or the code offset (Q6_K) meets bsums.
inline constexpr size_t kQ8KBlockBytes = 256 + 4 + 32;
struct Q8KRow {
  const float* d;
  const int16_t* bsums;
  const int8_t* q;
};
inline Q8KRow q8k_row(const std::byte* p, size_t K) {
  return {reinterpret_cast<const float*>(p + K), reinterpret_cast<const int16_t*>(p + K + 4 * (K / 256)),
          reinterpret_cast<const int8_t*>(p)};
}
// d = amax/127 of each 256 values and q = round-half-away(x/d), as quantize_activations (ggml's
// quantize_row_q8_K takes d = −max/127 with the sign of the largest value and rounds halves to
// even: the same codes up to the sign and exact halves); writes a Q8KRow's bytes.
void quantize_activations_k(const float* x, std::byte* out, size_t K);
// The block formats whose kernels take Q8KRows (the others take Q8Rows).
constexpr bool takes_q8k(GgmlType t) {
  return t == GgmlType::Q2_K || t == GgmlType::Q3_K || t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K ||
         t == GgmlType::IQ4_XS;
}
// The activation row type of format T's kernels, read from its bytes.
template <GgmlType T>
using ActRow = std::conditional_t<takes_q8k(T), Q8KRow, Q8Row>;
template <GgmlType T>
inline ActRow<T> act_row(const std::byte* p, size_t K) {
  if constexpr (takes_q8k(T)) return q8k_row(p, K);
  else return q8_row(p, K);
}

// True when the Avx512 path may use AVX512-VNNI (vpdpbusd); without it the block formats'
// Avx512 row of the format table holds the AVX2 kernels.
bool quant_vnni_supported();

namespace detail {
// One ISA's dot kernels for the block formats (rows of format.h's table): y[m, n] for n in
// [n0, n1) and every m, from weight rows in GemmArgs::w and activation rows in GemmArgs::xq:
// Q8Rows for the 32-value formats, Q8KRows for the K-quants (quantized once per call by matmul(),
// which also lays the Q8Row scales of each four rows side by side in GemmArgs::xd4, and for
// Q4_0, Q4_1, Q5_0 and Q5_1 their code sums in GemmArgs::xs4).
struct QuantKernels {
  FormatKernels q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs;
  void (*quantize)(const float* x, std::byte* out, size_t K);    // quantize_activations' bytes
  void (*quantize_k)(const float* x, std::byte* out, size_t K);  // quantize_activations_k's
};
extern const QuantKernels kQuantScalar, kQuantAvx2, kQuantAvx512;
}  // namespace detail

}  // namespace vlm::kernels
