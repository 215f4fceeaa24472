// How a kernel call runs: on which threads, with which instruction-set path and at which
// precision. Passed into every matrix product (and the ISA into the row ops) instead of
// process-wide switches, so two models in one process can run differently and a test can
// force a path without touching global state. The front end maps its own options (the
// CLI's VLM_ISA, --precision) to an Exec; the library reads no environment.
#pragma once
#include <cstddef>
#include <string_view>

#include "core/thread_pool.h"

namespace vlm::kernels {

// Instruction-set paths of the kernels.
enum class Isa { Scalar, Avx2, Avx512 };
bool isa_supported(Isa isa);
const char* isa_name(Isa isa);  // "scalar", "avx2", "avx512"
Isa best_isa();                 // the widest path this CPU supports
// The path named `name` (as isa_name spells it); throws a one-line vlm::Error naming
// `what` (e.g. "VLM_ISA") and the value when it is unknown or this CPU lacks it.
Isa parse_isa(std::string_view name, std::string_view what);

// Arithmetic of the matrix products.
//   F32:  exact products of f32 activations and the stored weights, f32 sums (the
//         oracle path; only the summation order differs from matmul_ref).
//   Bf16: the activations (x) are rounded to bf16 (nearest even) first, then multiplied
//         by the stored weights exactly and summed in f32 — what a bf16 checkpoint run in
//         bf16 computes. AVX512-BF16 does it with vdpbf16ps; elsewhere the kernels round x
//         and run the f32 path, which gives the same products. Attention's products of
//         activations with activations (scores, weighted values) follow the Exec they are
//         handed (nn/attention.h): the vision tower's at Bf16, the decoder's at F32 (exact()).
//   Block-quantized weights (Q8_0 ...) take x quantized per block to int8 (32 values; 256 for
//   the K-quants) under either mode (quant.h); under Bf16 where a bf16 GEMM is the faster route
//   (Exec::bf16_gemm Dot or Amx), a product of more rows than the format's dot_rows (Amx: 32; a
//   prefill; format.h) instead dequantizes the weights exactly and rounds them and x to bf16 for
//   that GEMM (docs/gguf.md, "Prefill on the bf16 dot").
enum class Precision { F32, Bf16 };
const char* precision_name(Precision p);  // "f32", "bf16"
Precision parse_precision(std::string_view name, std::string_view what);
// Whether this CPU has the AVX512-BF16 dot product.
bool bf16_dot_supported();
// Whether this CPU has AMX tiles with bf16 products (AMX-TILE and AMX-BF16) and Linux let this
// process use them (arch_prctl ARCH_REQ_XCOMP_PERM, asked once).
bool amx_supported();

// Where Bf16 products of more than the dot's rows run (prefill, batched decode past four rows, the
// vision tower and its attention), with the same bf16-rounded inputs and f32 sums in each:
//   Fma: on the f32 FMAs, the inputs widened exactly: bf16/f16/f32 weights through the f32 GEMM or
//        dot_bf16_fma, attention through the FMA twin of the bf16 micro-kernel; block formats
//        keep their int8 kernels.
//   Dot: on vdpbf16ps (the bf16 GEMM past 64 rows of bf16 weights and past 32 of f32/f16, the block
//        formats dequantized into it past dot_rows, attention on bf16 pairs).
//   Amx: matrix products of more than 32 rows and attention on AMX tiles (TDPBF16PS), block
//        formats dequantized into them; bf16 weights from 6 rows on the tiles too, as their A
//        operand (dot_amx); other products of 5..32 rows as Fma.
//   AmxModel: Amx with a scalar model of the tiles (the same sums, slowly), so that tests run the
//        tile kernels' blocking and layouts on any AVX512-BF16 CPU; never chosen by itself.
// Up to four rows (decode) the dot streams the weights at the memory's rate either way.
enum class Bf16Gemm { Fma, Dot, Amx, AmxModel };
// Amx: the fewest rows of a bf16-weight product that take the tiles (dot_amx; docs/gguf.md, "Few
// rows on AMX tiles").
inline constexpr size_t kAmxDotMinRows = 6;
const char* bf16_gemm_name(Bf16Gemm g);  // "fma", "dot", "amx", "amx-model"
// The fastest of them on this CPU: Amx where amx_supported(); else Dot where vdpbf16ps does
// more products per cycle than the f32 FMA, measured once per process (well under 1 ms): on the
// AMD Zen 4 VM the dot GEMM was the faster; on the Intel Xeon VM of 2026-12-01 the dot did half
// the FMA's products (0.45 vdpbf16ps per cycle against 1.84 FMAs) and a 512-token prefill ran
// 1.8× faster on the FMAs (docs/gguf.md, "Which kernels a bf16 product takes"); else Fma.
Bf16Gemm fastest_bf16_gemm();

struct Exec {
  ThreadPool* pool = nullptr;
  Isa isa = Isa::Scalar;
  Precision precision = Precision::F32;
  // Under Bf16 on AVX512-BF16: where products of more than four rows run (Bf16Gemm). Tests set it
  // to reach each route this CPU has; a route it lacks fails the product with a vlm::Error.
  Bf16Gemm bf16_gemm = fastest_bf16_gemm();

  // The default for a pool: the best ISA of this CPU, exact f32 products. Implicit, so
  // every call that passes a ThreadPool& runs the default.
  Exec(ThreadPool& p) : pool(&p), isa(best_isa()) {}  // NOLINT(google-explicit-constructor)
  // Throws vlm::Error when this CPU lacks `isa`.
  Exec(ThreadPool& p, Isa i, Precision pr = Precision::F32);

  // The kernels its products of many rows run on (the peak they are measured against): bf16_gemm
  // under Bf16 on AVX512-BF16, else Fma.
  Bf16Gemm gemm_kernels() const;

  ThreadPool& threads() const { return *pool; }
  // The same threads and ISA with exact f32 products.
  Exec exact() const {
    Exec e = *this;
    e.precision = Precision::F32;
    return e;
  }
};

}  // namespace vlm::kernels
