// Grouped-query attention for the Gemma 3 decoder (spec §10.4): query head h reads
// KV head h / (nH / nKV); scores = q·k · scale + mask, softmax in f32, o = P·v.
// The two products run on the matmul kernels (threaded there); softmax rows are
// threaded over the pool.
#pragma once
#include <cstddef>

#include "core/thread_pool.h"

namespace vlm::models {

struct AttnShape {
  size_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float scale = 0;  // query_pre_attn_scalar^-0.5
};

// Prefill: Lq queries q [Lq, nH, d] against Lk keys/values k/v [Lk, nKV, d] with an
// additive mask [Lq, Lk] (row = query). Per block of query rows only the key range
// holding allowed entries is computed; entries equal to the lowest finite f32 add
// exactly 0 after softmax next to any allowed key. A row with no allowed key yields
// zeros, so padded rows stay finite. out [Lq, nH·d].
void attention_prefill(const float* q, size_t Lq, const float* k, const float* v, size_t Lk,
                       const float* mask, const AttnShape& s, float* out, ThreadPool& pool);

// One query token of one sequence against n cached positions, all visible (no mask):
// q [nH, d], k/v [n, nKV, d] (cache rows), out [nH·d].
void attention_decode(const float* q, const float* k, const float* v, size_t n, const AttnShape& s,
                      float* out, ThreadPool& pool);

}  // namespace vlm::models
