// Weight storage formats, one row of a table each (the way ggml's type_traits and
// gemma.cpp's Type describe theirs): block shape, row conversion to f32, and per ISA the
// kernels that multiply activations with rows of that format. A new format (a
// block-quantized one) plugs into matmul() by adding its DType and a row here; nothing in
// the dispatcher changes.
#pragma once
#include <cstddef>

#include "core/dtype.h"
#include "kernels/exec.h"

namespace vlm::kernels {

namespace detail {
struct GemmArgs;
}

// One ISA's kernels for one format (see matmul_isa.h for GemmArgs and the contracts).
struct FormatKernels {
  // y[:, n0:n1] for any M by dot products that stream each weight row once (nk layout).
  void (*dot)(const detail::GemmArgs&, size_t n0, size_t n1) = nullptr;
  // Packed register-tiled product of y[m0:m1, n0:n1]; nullptr: dot serves every M.
  void (*gemm)(const detail::GemmArgs&, size_t n0, size_t n1, size_t m0, size_t m1, float* pack) = nullptr;
  // The same with x rounded to bf16 by the hardware dot (Precision::Bf16); nullptr: none.
  void (*gemm_bf16)(const detail::GemmArgs&, size_t n0, size_t n1, size_t m0, size_t m1, float* pack) = nullptr;
  // The same on AMX tiles (Exec::bf16_gemm Amx), x as bf16 words in GemmArgs::xq followed by
  // kAmxTileRows rows of zeros (matmul_isa.h), for f16 weights each x value twice (a pair);
  // nullptr: none.
  void (*gemm_amx)(const detail::GemmArgs&, size_t n0, size_t n1, size_t m0, size_t m1, float* pack) = nullptr;
  // dot's counterpart on the hardware bf16 dot: x as bf16 words in GemmArgs::xq, each row
  // zero-padded to whole 64-byte vectors; nullptr: none.
  void (*dot_bf16)(const detail::GemmArgs&, size_t n0, size_t n1) = nullptr;
  // dot_bf16's products for several rows on the f32 FMAs (AVX512: 5..32 rows with
  // Exec::bf16_gemm other than Dot; AVX2: 2..32 rows under Precision::Bf16): x rounded to bf16 in
  // GemmArgs::xq as f32, each 32 values' even entries before their odd ones, rows zero-padded
  // to whole 32-value groups; nullptr: none.
  void (*dot_bf16_fma)(const detail::GemmArgs&, size_t n0, size_t n1) = nullptr;
  // dot's counterpart on AMX tiles (up to kAmxDotRows rows, Exec::bf16_gemm Amx): the weights are the
  // tiles' A operand, bf16 read as stored, block formats dequantized into bf16 rows first; x as pair
  // columns in GemmArgs::xq (pair_x in matmul.cpp); nullptr: none.
  void (*dot_amx)(const detail::GemmArgs&, size_t n0, size_t n1) = nullptr;
};

struct Format {
  DType type;
  const char* name;
  size_t block;        // elements per block (1 for f32/f16/bf16)
  size_t block_bytes;  // bytes per block
  // dst[0, n) = the stored values src[0, n) as f32 (n a multiple of block; exact for
  // f32/f16/bf16, the dequantized values for a block format).
  void (*to_f32)(const std::byte* src, float* dst, size_t n);
  // The activation format the dot kernels want x in: F32 means plain f32 rows (a.x).
  // Otherwise matmul() converts each x row once with format_of(act).from_f32 and passes
  // the rows as a.xq / a.ldxq (bytes), the way ggml quantizes src1 to vec_dot_type.
  DType act;
  // x row → this format (n a multiple of block); needed only by a format used as `act`.
  void (*from_f32)(const float* src, std::byte* dst, size_t n);
  bool kn;                   // also usable in [K, N] (in → out) layout
  FormatKernels isa[3];      // indexed by Isa; a null dot: no kernels on that ISA
  // The most activation rows the dot kernels take where a GEMM could (more rows pack, or
  // dequantize into the bf16 GEMM): streaming each weight row once beats packing up to 32 rows
  // of f32/f16/bf16 (bf16 on the bf16 dot: up to kBf16DotRows, matmul_isa.h); a block format's
  // int8 kernels beat dequantizing up to the rows measured per format (docs/gguf.md, "Prefill on
  // the bf16 dot").
  size_t dot_rows = 32;

  size_t row_bytes(size_t n) const { return n / block * block_bytes; }
};

// The row for a storage type; throws a one-line vlm::Error for a type without one.
const Format& format_of(DType type);

}  // namespace vlm::kernels
