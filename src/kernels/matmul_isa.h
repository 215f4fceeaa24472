// Internal interface between the matmul dispatcher (matmul.cpp, baseline ISA) and
// the per-ISA kernel files. The ISA files expose only plain function pointers, so no
// inline library code compiled for a wider ISA can leak into baseline code.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "io/gguf.h"
#include "kernels/format.h"
#include "kernels/matmul.h"

namespace vlm::kernels::detail {

// y[m, n] (+)= sum_k x[m, k] · W(n, k) over m in [0, M), n in [0, N).
// Row n of W starts at w + n·ldw_bytes (nk layout, nn.Linear); in kn layout row k does
// and holds W(·, k).
struct GemmArgs {
  const float* x;
  size_t ldx, M;
  const std::byte* w;
  DType dtype;
  size_t ldw_bytes;
  bool kn;
  size_t K, N;
  const float* bias;  // N entries or nullptr
  float* y;
  size_t ldy;
  // x converted to the format's activation type (Format::act), rows ldxq bytes apart;
  // nullptr when the format takes f32 x.
  const std::byte* xq = nullptr;
  size_t ldxq = 0;
  // Block formats whose xq holds Q8Rows, M > 1: the block scales of each group of four rows side by
  // side, [(M + 3) / 4][K / 32][4], zero past row M, so a tile applies them to four rows at once.
  const float* xd4 = nullptr;
  // Q8_0, IQ4_NL, Q4_0, Q4_1, Q5_0 and Q5_1 weights: likewise the blocks' code sums Σq (they meet
  // the code offsets, the m of Q4_1 and Q5_1, and the 128 added to the signed weights of Q8_0 and
  // IQ4_NL); nullptr otherwise.
  const int32_t* xs4 = nullptr;
  // Q4_K, Q5_K and IQ4_XS weights, M > 1: each row's sums of its codes per 32 values (two Q8KRow
  // bsums each), [M][K / 32]: a Q4_K or Q5_K sub-block's min meets its whole sum, two sub-blocks in
  // one vpdpwssd; an IQ4_XS sub-block's signed sum starts from −128 times it.
  const int16_t* xs32 = nullptr;
  // FormatKernels::gemm_amx: a scalar model of the tiles in place of the tiles (Bf16Gemm::AmxModel).
  bool tiles_model = false;
  // F16 weights: Weight::bf16_exact.
  bool bf16_exact = false;
};

// The decode kernels (dot_bf16_row1, the block formats' dot_row1, and the bf16 tiles of batched decode) ask
// for each of their weight streams' bytes this far ahead of the loads: the hardware prefetchers
// alone left 20-30 % of the read bandwidth unused (docs/gguf.md, "Decode streams").
inline constexpr size_t kRowAhead = 2048;

// The most activation rows the bf16 dot kernels take (dot_bf16, and dot_bf16_fma up to the bf16
// format's dot_rows, 32): their groups' sums between column blocks are held for this many. matmul.cpp
// routes bf16 weights on the Dot route to them up to here: the bf16 GEMM packs the weights again for
// every call, which only many rows pay back (a 10240 × 2560 product at 33 rows: 4.1 ms on the dot,
// 7.1 on the GEMM; the two even at about 96 rows, 2560 × 10240 at about 72; Zen 5, two threads).
inline constexpr size_t kBf16DotRows = 64;

// FormatKernels::dot_bf16_fma's x and weights are read in 32-value groups that start on the
// weights' 64-byte lines (a load split across two lines costs 30 % here): the bf16 values of a
// row before its first line boundary form the tail of group 0, whose head is `shift` zeros.
// 0 when rows differ in alignment.
inline size_t fma_dot_shift(const GemmArgs& a) {
  return a.ldw_bytes % 64 ? 0 : (reinterpret_cast<uintptr_t>(a.w) & 63) / 2;
}

// The widest vector's floats (AVX-512): attend_f32 keeps a row's running maximum in one.
inline constexpr size_t kMaxLanes = 16;

// attention's products (matmul.h, attend) over one packed KV head.
struct AttendArgs {
  const float* q;
  size_t ldq, rows;
  const float *keys, *values;               // f32 panels (IsaKernels::attend)
  const uint32_t *key_pairs, *value_pairs;  // bf16 pairs (attend_bf16 and attend_amx, pack_keys_bf16)
  size_t n, d, k0, k1;                      // n keys packed, d values each; [k0, k1) attended
  float scale;
  const float* mask;  // [rows, k1 - k0], rows ldm apart, or null
  size_t ldm;
  float* out;
  size_t ldo;
  Isa isa;           // of softmax and the rounding
  bool round;        // f32 panels: the probabilities rounded to bf16 (q arrives rounded)
  bool tiles_model;  // attend_amx: a scalar model of the tiles in place of the tiles
  float* scratch;  // f32 panels: the scores, rows lds floats apart (at least the whole panels
  size_t lds;      // spanning [k0, k1)), then kMaxLanes floats a row for their maxima
};

// The f32/f16/bf16 kernels of one ISA and its packed-path geometry. dot: any M (nk only),
// y[:, n0:n1] with weights streamed once. gemm: y[m0:m1, n0:n1] register-tiled from
// packed panels (pack holds pack_floats floats, 64-byte aligned; n0 a multiple of panel).
// gemm_bf16 / dot_bf16 (AVX512-BF16, bf16 nk only): gemm / dot with x rounded to bf16 and
// vdpbf16ps; dot_bf16_fma: dot_bf16's products on the f32 FMAs.
struct IsaKernels {
  const char* name;
  FormatKernels f32, f16, bf16;
  size_t panel;        // output columns per packed panel
  size_t row_tile;     // rows per register tile
  size_t pack_floats;  // scratch size for gemm
  // A register-resident FMA loop (the roofline's compute peak); returns FLOPs done.
  double (*fma_loop)(size_t iters);
  // Reads n floats from each of `streams` streams `stride` floats apart, in lockstep, with the
  // widest loads and four independent sums (the bandwidth probe).
  float (*read_loop)(const float* p, size_t n, size_t streams, size_t stride);
  // Attention's products on the register tiles (matmul.h, attend): keys and values [n, d]
  // (rows ld floats apart) into kp (panels of `panel` keys, [d][panel]) and vp (panels of
  // `panel` columns, [n][panel]), zero past n and d; then attend on them.
  void (*pack_kv)(const float* k, const float* v, size_t ld, size_t n, size_t d, float* kp, float* vp);
  void (*attend)(const AttendArgs& a);
};

// AVX512-BF16 only: a register-resident vdpbf16ps loop (the bf16 dot peak); FLOPs done.
double bf16_dot_loop(size_t iters);
// AMX only (amx_supported()): a TDPBF16PS loop on tiles (their peak); FLOPs done.
double amx_loop(size_t iters);
// The rows of x one AMX block reads (two 16-row tiles): FormatKernels::gemm_amx reads x up to
// this many rows past its last, and the row blocks of a product split at multiples of it.
inline constexpr size_t kAmxTileRows = 32;
// The most x rows FormatKernels::dot_amx takes: four B tiles of 16 (pair_x in matmul.cpp).
inline constexpr size_t kAmxDotRows = 64;
// AVX512 only: n values (whole blocks) of block format t, bit for bit dequantize_row's.
void dequantize_blocks_avx512(GgmlType t, const std::byte* src, float* y, size_t n);
// AVX512-BF16 only: FormatKernels::gemm_bf16 for the block formats (weights dequantized
// exactly, then rounded to bf16 with x) and for f16 weights whose values are bf16 values
// (GemmArgs::bf16_exact; the rounding leaves them as they are).
void gemm_bf16dot_rounded(const GemmArgs& a, size_t n0, size_t n1, size_t m0, size_t m1, float* pack);
// AVX512-BF16 only: the same on AMX tiles (FormatKernels::gemm_amx; GemmArgs::tiles_model: on the
// scalar model of them).
void gemm_amx_rounded(const GemmArgs& a, size_t n0, size_t n1, size_t m0, size_t m1, float* pack);
// AMX only: FormatKernels::dot_amx for the block formats, 33..kAmxDotRows rows (x as pair_x writes
// it, 64 columns), the weights dequantized as for gemm_amx_rounded.
void dot_amx_rounded(const GemmArgs& a, size_t n0, size_t n1);

// AVX512-BF16 only: attention's products on the bf16 dot (matmul.h, attend). Keys [n, d] (rows ld
// floats apart) pack as pack_b_pairs packs a weight: panels of 64 keys, words [pair_rows][64]
// (pair_rows at least (d + 1) / 2), zero past n and d. Values [n, d] pack as words [pairs][dv],
// with n padded to whole panels of 64 keys and dv = d rounded up to 16: word (p, j) holds V(2p, j)
// low and V(2p + 1, j) high, except the interleaved tail of attend_bf16. With `tiles` (attend_amx,
// pair_rows a multiple of 16) both lie as the tiles' B operand reads them whole: a panel of keys
// as four groups of 16 keys, each [pair_rows][16]; the values as groups of 16 columns, each
// [pairs][16] (zero columns up to a whole 32: dt = d rounded up to 32).
void pack_keys_bf16(const float* k, size_t ld, size_t n, size_t d, uint32_t* dst, size_t pair_rows, bool tiles);
void pack_values_bf16(const float* v, size_t ld, size_t n, size_t d, uint32_t* dst, bool tiles);
void attend_bf16(const AttendArgs& a);
// AVX512-BF16 only: the same products on AMX tiles (AttendArgs::tiles_model: on the scalar model):
// keys and values packed with `tiles` (pair_rows a multiple of 16).
void attend_amx(const AttendArgs& a);

extern const IsaKernels kScalarKernels;
extern const IsaKernels kAvx2Kernels;
extern const IsaKernels kAvx512Kernels;
const IsaKernels& kernels_for(Isa isa);

}  // namespace vlm::kernels::detail
