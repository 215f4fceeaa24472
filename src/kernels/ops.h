// Element-wise and row-wise kernels of the Gemma 3 / SigLIP graphs, all in f32.
// Rows are contiguous ([rows, dim] row-major); x and y may be the same buffer.
// The norms, gelu and softmax run on the ISA path given as the last argument (default:
// the best this CPU has; pass the call's Exec::isa to follow a forced path). Sums are f32 in vector lanes; exp and tanh are our own
// vectorized versions, a few ulp from the exact functions (tests/unit/kernels_test.cpp
// states the bounds). One call is single-threaded: split rows across a pool to scale.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/exec.h"

namespace vlm::kernels {

// Gemma RMSNorm (docs/gemma3/decoder.md#rmsnorm): y = x / sqrt(mean(x²) + eps) · (1 + w), per row.
// w has `dim` entries (stored zero-centred, converted to f32 by the caller).
void rms_norm(const float* x, const float* w, float* y, size_t rows, size_t dim, float eps,
              Isa isa = best_isa());

// LayerNorm with bias (docs/gemma3/vision.md#siglip): y = (x − mean) / sqrt(var + eps) · g + b, biased variance
// (two passes, with the mean corrected by the deviations' sum).
void layer_norm(const float* x, const float* g, const float* b, float* y, size_t rows, size_t dim,
                float eps, Isa isa = best_isa());

// gelu_pytorch_tanh in place: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
void gelu_tanh(float* x, size_t n, Isa isa = best_isa());
// gate[i] = gelu_tanh(gate[i]) · up[i] (the Gemma MLP's gated activation).
void gelu_tanh_mul(float* gate, const float* up, size_t n, Isa isa = best_isa());

// y[i] = x[i] rounded to bf16 (nearest even) and back to f32, as vlm::round_bf16; y may be x.
void round_to_bf16(const float* x, float* y, size_t n, Isa isa = best_isa());
// y[i] = x[i] as bf16 (nearest even), the bits of vlm::f32_to_bf16.
void to_bf16(const float* x, uint16_t* y, size_t n, Isa isa = best_isa());

// In-place softmax over one row of n entries, with max subtraction. Finite for any
// finite input (all entries equal to the lowest f32 give a uniform row; entries at the
// lowest f32 next to normal ones get exactly 0); a row that is all −inf gives zeros
// rather than NaN. Probabilities below FLT_MIN are flushed to 0.
void softmax(float* x, size_t n, Isa isa = best_isa());
// Attention's probabilities of one row: softmax(x · scale + mask) in place (mask: n additive
// values, or null), each then rounded to bf16 when round is set. The f32 operations of the
// scaling, softmax() and round_to_bf16() one after the other, in three passes over x, not five.
void scaled_softmax(float* x, size_t n, float scale, const float* mask, bool round, Isa isa = best_isa());
// scaled_softmax before its division: x ← e^(x · scale + mask − max) in place; returns the sum
// (0 for a row with no allowed entry, which becomes zeros). Multiplying by 1/sum gives
// scaled_softmax's probabilities to the bit.
float scaled_exp(float* x, size_t n, float scale, const float* mask, Isa isa = best_isa());
// scaled_softmax's last two passes, for a row already scaled (and masked) whose maximum mx is
// known: the same probabilities to the bit.
void exp_normalize(float* x, size_t n, float mx, bool round, Isa isa = best_isa());

// One chunk of a decode row's attention (docs/gemma3/decoder.md#decode-attention): H query
// heads q[H, d], each G sharing a KV head, against n positions of keys and values k/v (a
// position's H/G heads side by side, rows `stride` values apart). Per query head
// s = q·kᵀ · scale, m = max s, l = Σ e^(s − m), o[d] = Σ e^(s − m)·v, unnormalized so that
// chunks merge. p: H·n floats of work; m, l: H; o: [H, d].
void attend_chunk(const float* q, size_t H, size_t G, const float* k, const float* v, size_t stride, size_t n,
                  size_t d, float scale, float* p, float* m, float* l, float* o, Isa isa = best_isa());
// The same over a bf16 cache's rows (widened exactly; the sums as above).
void attend_chunk(const float* q, size_t H, size_t G, const uint16_t* k, const uint16_t* v, size_t stride,
                  size_t n, size_t d, float scale, float* p, float* m, float* l, float* o, Isa isa = best_isa());

// RoPE, rotate-half / NeoX convention (docs/gemma3/decoder.md#rope), in place on x[heads, d]:
//   x'[i] = x[i]·cos[i] − x[i+d/2]·sin[i],  x'[i+d/2] = x[i+d/2]·cos[i] + x[i]·sin[i],
// with cos/sin holding d/2 entries for this token's position.
void rope_rotate_half(float* x, size_t heads, size_t d, const float* cos, const float* sin);

// inv_freq[i] = (1 / base^(2i/d)) / factor for i < d/2, in f32 as HF computes it.
void rope_inv_freq(size_t d, float base, float factor, float* inv_freq);
// cos/sin[i] of θ_i = float(pos) · inv_freq[i] (f32 product), for i < half.
void rope_cos_sin(int64_t pos, const float* inv_freq, size_t half, float* cos, float* sin);

}  // namespace vlm::kernels
