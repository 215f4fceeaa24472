// Scaled dot-product attention shared by every model (the Gemma 3 decoder's grouped-query
// attention, the SigLIP encoder's full attention): query head h reads KV head
// h / (nH / nKV); scores = q·k · scale + mask, softmax in f32, o = P·v. attention() runs the
// two products at the Exec's precision: F32 exact, or Bf16 with q, k, v and P rounded to bf16
// and f32 sums, as a bf16 checkpoint's attention runs in the reference. Each KV head is packed
// once per call and every piece of query rows attends to it in one kernel (kernels/matmul.h,
// attend: the AVX512-BF16 dot, or the f32 register tiles on rounded inputs, the same products).
// The decoder passes exact() (f32 rows: its bf16 cache's widened exactly); the vision tower passes its
// precision (docs/gemma3/vision.md).
#pragma once
#include <cstddef>
#include <span>
#include <vector>

#include "core/dtype.h"
#include "kernels/exec.h"
#include "kernels/matmul.h"

namespace vlm::nn {

struct AttnShape {
  size_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float scale = 0;  // multiplies q·k (Gemma 3: query_pre_attn_scalar^-0.5)
};

// Which keys each query row may see, handed out as exact additive tiles (0.0 allowed,
// the lowest finite f32 blocked), so no [Lq, Lk] array need exist.
class MaskTiles {
 public:
  virtual ~MaskTiles() = default;
  // Keys [lo, hi) holding every allowed entry of row q; lo >= hi when it has none.
  virtual void row_span(size_t q, size_t* lo, size_t* hi) const = 0;
  // The additive values of rows [q0, q1) × keys [k0, k1), row-major.
  virtual void tile(size_t q0, size_t q1, size_t k0, size_t k1, float* out) const = 0;
};

// One decode row: a single query token q [nH, d] against its own sequence's n keys and
// values k/v [n, nKV, d] (f32 or bf16, as attention_decode is told), all visible; out [nH·d].
struct DecodeRow {
  const float* q;
  const void *k, *v;
  size_t n;
  float* out;
};
struct DecodeTask {
  size_t row, t0;  // a row's chunk of keys from t0
};

// Work rows of attention(), kept by the caller between calls (they only grow).
struct AttnScratch {
  std::vector<float> scores, tile;
  std::vector<size_t> lo, hi;
  std::vector<kernels::PackedKv> kv;  // attention(): each KV head packed
  std::vector<DecodeTask> tasks;      // attention_decode: its pieces of work
  std::vector<float> part;            // attention_decode: each piece's unnormalized result
  std::vector<size_t> first;          // attention_decode: each row's first chunk, then the end
};

// Lq queries q [Lq, nH, d] against Lk keys/values k/v [Lk, nKV, d]; mask null = every key
// visible. Per block of query rows only the keys spanned by allowed entries are computed;
// blocked entries add exactly 0 after softmax next to any allowed key. A row with no
// allowed key yields zeros, so padded rows stay finite. out [Lq, nH·d].
void attention(const float* q, size_t Lq, const float* k, const float* v, size_t Lk, const MaskTiles* mask,
               const AttnShape& s, float* out, AttnScratch& scratch, const kernels::Exec& ex);

// The attention of every decode row of a step at once, in f32 sums whatever the Exec's precision
// over keys and values of type kv (F32 or BF16: only the decoder decodes, from its cache): chunks
// of each row's keys spread over the pool, each chunk's keys and values read from memory once for
// all heads (kernels/ops.h attend_chunk), then each head's chunks merged.
void attention_decode(std::span<const DecodeRow> rows, const AttnShape& s, DType kv, AttnScratch& scratch,
                      const kernels::Exec& ex);
// Sizes scratch for attention_decode of up to `rows` rows over up to max_keys keys each.
void reserve_decode(AttnScratch& scratch, const AttnShape& s, size_t rows, size_t max_keys);

}  // namespace vlm::nn
