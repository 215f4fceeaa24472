// Grouped-query attention for the Gemma 3 decoder (spec §10.4): query head h reads
// KV head h / (nH / nKV); scores = q·k · scale + mask, softmax in f32, o = P·v.
// Threaded over heads (and query rows in prefill).
#pragma once
#include <cstddef>

#include "core/thread_pool.h"

namespace vlm::models {

struct AttnShape {
  size_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float scale = 0;  // query_pre_attn_scalar^-0.5
};

// Prefill: q [L, nH, d], k/v [L, nKV, d], additive mask [L, L] (row = query).
// Keys whose mask entry is the lowest finite f32 are skipped (exp of it is exactly 0
// next to any allowed key); a row with no allowed key yields zeros, so padded rows
// stay finite. out [L, nH·d].
void attention_prefill(const float* q, const float* k, const float* v, const float* mask, size_t L,
                       const AttnShape& s, float* out, ThreadPool& pool);

// One query per sequence against its cached keys: q [nH, d]; k/v [n, nKV, d] all visible.
// out [nH·d]. Several sequences are handled by the caller's loop (see Gemma3::decode_step).
void attention_one(const float* q, const float* k, const float* v, size_t n, const AttnShape& s,
                   size_t head, float* out, float* scratch);

}  // namespace vlm::models
