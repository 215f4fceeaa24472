// The batch door into a decoder, like llama.cpp's llama_batch: rows of several sequences
// (prompt chunks and one-row decodes) with explicit positions and sequence ids go through
// the weights in one pass; attention runs per sequence over its own KV cache; logits are
// produced only for the rows that ask for them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>

#include "models/kv_cache.h"
#include "models/mask.h"

namespace vlm::models {

struct SeqSlot {         // one sequence taking part in a forward pass
  KvCache* cache;        // its keys and values; the new rows are appended
  // Null for decode rows: one, or a draft's few (each sees its whole visible cache, the rows
  // before it and itself; no more rows than the sliding window); else the prompt chunk's mask.
  const MaskSpec* mask;
};

struct Batch {
  const float* embeds = nullptr;        // [n, H] post-scale rows (the decoder never scales again)
  size_t n = 0;
  const int64_t* pos = nullptr;         // per row; a sequence's rows are contiguous, in order,
                                        // starting at its cache->length()
  const int32_t* seq = nullptr;         // per row: index into the SeqSlot span
  const uint8_t* want_logits = nullptr; // per row: 1 = write a logits row for it (in row order)
  int valid_rows = -1;                  // right padding (dumps/tests): rows >= this are padding
};

// Named observation points, llama.cpp `cb(cur, name, il)` style: called with the point's
// name, the layer (-1 outside layers), and its rows [rows, cols] for every row of the batch.
// Points of a decoder layer, in order: "attn_norm", "attn_out" (after the output
// projection), "attn_post_norm", "ffn_inp" (residual after attention), "ffn_out" (after
// the post-feedforward norm), "l_out" (the residual stream leaving the layer); after the
// last layer "result_norm".
using Observer =
    std::function<void(std::string_view name, int layer, const float* data, size_t rows, size_t cols)>;

}  // namespace vlm::models
