// Work state of a Gemma 3 decoder forward pass, owned by the caller (the way gemma.cpp's
// Activations is): role-named buffers sized once for a batch shape, so the decoder stays
// const and shareable, and a decode step allocates nothing.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "io/config.h"
#include "models/batch.h"
#include "nn/attention.h"

namespace vlm::models::gemma3 {

struct Activations {
  // Room for batches of up to max_rows rows; max_keys (optional) pre-sizes the attention
  // work rows for decodes over up to that many cached positions (else they grow on use).
  Activations(const TextConfig& c, size_t max_rows, size_t max_keys = 0);

  size_t max_rows = 0;
  std::vector<float> x;          // [rows, H] residual stream
  std::vector<float> normed;     // [rows, H] norm outputs feeding the projections
  std::vector<float> q;          // [rows, nH·d]
  std::vector<float> k, v;       // [rows, nKV·d]
  std::vector<float> attn;       // [rows, nH·d] attention output per head
  std::vector<float> proj;       // [rows, H] output-projection / down-projection rows
  std::vector<float> gate, up;   // [rows, I]
  std::vector<float> rope_cos[2], rope_sin[2];  // [rows, d/2] per row position; [0] local, [1] global
  std::vector<float> ctx_k, ctx_v;  // [W + rows, nKV·d] a sliding layer's visible keys in position order
  std::vector<float> head_in;    // [rows, H] final-normed rows that want logits
  std::vector<uint32_t> runs;    // per slot: first row, end row (2 per slot)
  std::vector<nn::DecodeRow> decode_rows;  // a layer's decode rows, attended together
  // Inputs the convenience wrappers (decode_step) build: [rows, H], per-row ids.
  std::vector<float> embeds;
  std::vector<int32_t> ids;
  std::vector<int64_t> pos;
  std::vector<int32_t> seq;
  std::vector<uint8_t> want;
  std::vector<SeqSlot> slots;
  nn::AttnScratch attn_work;
};

}  // namespace vlm::models::gemma3
