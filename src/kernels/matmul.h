// Matrix products against stored weights. Activations are f32; weights stay in
// their stored dtype (f32, f16, bf16) and are converted on the fly (exactly: the
// products and sums are f32, only the summation order differs from matmul_ref).
// Each call runs as its Exec says (threads, ISA path, precision; see exec.h); a plain
// ThreadPool& means the best ISA at f32. matmul_ref() is the plain path that tests
// compare against.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/dtype.h"
#include "core/huge_pages.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/exec.h"
#include "kernels/format.h"

namespace vlm::kernels {

// A row-major weight matrix [rows, cols] viewed in place: for matmul() rows = N outputs
// and cols = K inputs (nn.Linear layout). dtype is its storage format (a row of the
// table in format.h); row_bytes is the stored row stride in bytes (0: rows are dense),
// so a view of some columns of a wider matrix (one attention head) is a Weight too.
struct Weight {
  const std::byte* data = nullptr;
  DType dtype = DType::F32;
  size_t rows = 0, cols = 0;
  size_t row_bytes = 0;
  // F16 only: every value is also a bf16 value (mark_bf16_exact found it so), as in an f16 file made
  // from a bf16 checkpoint (mmproj-model-f16.gguf). Under Precision::Bf16 the bf16 GEMMs then take
  // the weight as bf16, the products unchanged (docs/gguf.md, "f16 weights that are bf16 values").
  bool bf16_exact = false;
  size_t stride_bytes() const { return row_bytes ? row_bytes : format_of(dtype).row_bytes(cols); }
};
// A 2-D tensor view as a Weight; throws if it is not 2-D.
Weight as_weight(const TensorView& t);
// Sets w.bf16_exact when w is f16 and every value of it is a bf16 value too: one pass over its
// bytes. Other formats are left as they are.
void mark_bf16_exact(Weight& w);
// An f32 buffer [rows, cols] with row stride ld floats (0: cols) as a Weight.
Weight f32_weight(const float* data, size_t rows, size_t cols, size_t ld = 0);

// y[M, N] = x[M, K] · Wᵀ, with K = w.cols and N = w.rows. y is overwritten.
void matmul(const float* x, size_t M, const Weight& w, float* y, const Exec& ex);
// The plain loop the tests compare against; with Precision::Bf16 it rounds each x to bf16.
void matmul_ref(const float* x, size_t M, const Weight& w, float* y,
                Precision precision = Precision::F32);

// Products of one x with several weights of its K columns (q, k and v; gate and up): y[M, w.rows]
// = x · wᵀ for each. Up to four products of one format, on the dot route (small M), run as one
// loop over all their rows with x converted once, so the threads meet once instead of once per
// product; otherwise each runs as matmul(). The results are matmul()'s to the bit.
struct Product {
  Weight w;
  float* y;
};
void matmul_each(const float* x, size_t M, std::span<const Product> products, const Exec& ex);

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

// Attention's products (nn/attention): the keys and values [n, d] of one KV head (rows ld floats
// apart), packed once for every query row that reads them, in the form the Exec's kernels take:
// bf16 pairs for the AVX512-BF16 dot or the AMX tiles (Precision::Bf16 where Exec::bf16_gemm is Dot,
// Amx or AmxModel), else f32 panels of the Exec's ISA, rounded to bf16 under Precision::Bf16. The
// f32 panels hold about as much as k and v.
struct PackedKv {
  std::vector<float> k, v;               // f32 panels
  HugePageVector<uint32_t> k_pairs, v_pairs;  // bf16 pairs, 64-byte aligned (the tiles' rows whole lines)
  size_t n = 0, d = 0;
  Isa isa = Isa::Scalar;
  Precision precision = Precision::F32;
  bool pairs = false;  // which of the two forms
  bool tiles = false;  // pairs laid out for the tiles
};
void pack_kv(const float* k, const float* v, size_t ld, size_t n, size_t d, PackedKv& kv, const Exec& ex);
// out[rows, d] = softmax(q·kᵀ · scale + mask) · v over the keys [k0, k1) of kv, for query rows
// q (ldq apart), at the Exec's precision (Bf16: q and the probabilities rounded to bf16 as well),
// f32 sums. mask: the additive [rows, k1 − k0] tile (rows ldm apart) or null. kv must be packed
// for the same Exec (ISA, precision and route). Runs on the calling thread.
void attend(const float* q, size_t ldq, size_t rows, const PackedKv& kv, size_t k0, size_t k1, float scale,
            const float* mask, size_t ldm, float* out, size_t ldo, const Exec& ex);

}  // namespace vlm::kernels
