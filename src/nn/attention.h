// Scaled dot-product attention shared by every model (the Gemma 3 decoder's grouped-query
// attention, the SigLIP encoder's full attention): query head h reads KV head
// h / (nH / nKV); scores = q·k · scale + mask, softmax in f32, o = P·v. The two products
// run on the matmul kernels (threaded there); softmax rows are threaded over the pool.
#pragma once
#include <cstddef>
#include <vector>

#include "kernels/exec.h"

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

// Work rows of attention(), kept by the caller between calls (they only grow).
struct AttnScratch {
  std::vector<float> scores, tile;
  std::vector<size_t> lo, hi;
};

// Lq queries q [Lq, nH, d] against Lk keys/values k/v [Lk, nKV, d]; mask null = every key
// visible. Per block of query rows only the keys spanned by allowed entries are computed;
// blocked entries add exactly 0 after softmax next to any allowed key. A row with no
// allowed key yields zeros, so padded rows stay finite. out [Lq, nH·d].
void attention(const float* q, size_t Lq, const float* k, const float* v, size_t Lk, const MaskTiles* mask,
               const AttnShape& s, float* out, AttnScratch& scratch, const kernels::Exec& ex);

// One query token against n keys, all visible (a decode row): q [nH, d], k/v [n, nKV, d],
// out [nH·d]. The query heads sharing a KV head go through the products together.
void attention_decode(const float* q, const float* k, const float* v, size_t n, const AttnShape& s, float* out,
                      AttnScratch& scratch, const kernels::Exec& ex);

}  // namespace vlm::nn
