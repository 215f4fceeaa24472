// The Gemma 3 text decoder (transformers Gemma3TextModel / Gemma3DecoderLayer). Weights
// are views of the checkpoint's stored tensors (bf16/f16/f32, never copied to f32 except
// the small norm vectors); activations are f32 and live in caller-owned Activations, so a
// Decoder is immutable after construction and may be shared between threads.
//
// One door: forward() takes a Batch of post-scale embedding rows of several sequences
// (prompt chunks with their MaskSpec, one-row decodes without) and runs every row through
// one layer function. prefill_from_embeddings() and decode_step() are thin wrappers on it.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "io/checkpoint.h"
#include "kernels/exec.h"
#include "kernels/matmul.h"
#include "models/batch.h"
#include "models/embedder.h"
#include "models/gemma3/activations.h"
#include "models/kv_cache.h"
#include "models/prefill_input.h"
#include "nn/attention.h"

namespace vlm::models::gemma3 {

struct PrefillOptions {
  bool all_logits = false;           // logits for every row (else only row valid_len − 1)
  const Observer* observer = nullptr;  // named observation points (dumps)
};

struct DecodeItem {
  KvCache* cache;
  int32_t token;
};

class Decoder {
 public:
  // Rows per range of a layer's row-wise work (norms, RoPE, the GELU product, residual adds): a
  // decode step (up to a batch of 16 rows) runs it inline rather than waking the pool for
  // microseconds of work.
  static constexpr size_t kRowGrain = 16;

  // `ex` (threads, ISA path, precision) runs every kernel call; a ThreadPool& converts to
  // the default (best ISA, exact f32).
  Decoder(const Checkpoint& ckpt, const kernels::Exec& ex, EmbedScaling scaling = EmbedScaling::Reference);

  const TextConfig& config() const { return cfg_; }
  const TextEmbedder& embedder() const { return embedder_; }
  int vocab() const { return int(head_.rows); }
  ThreadPool& pool() const { return ex_.threads(); }
  const kernels::Exec& exec() const { return ex_; }
  // The cache's rows at this decoder's precision (docs/gemma3/decoder.md, "KV cache").
  DType kv_dtype() const { return KvCache::dtype_for(ex_.precision); }
  KvCache new_cache(int64_t context) const { return KvCache(cfg_, context, kv_dtype()); }

  // Runs the batch's rows through every layer and appends each sequence's valid rows to
  // its cache. A sequence's rows are contiguous and start at its cache length (a non-empty
  // cache makes them a continuation: every row also sees the cached keys, all of them on
  // global layers, those within the window on sliding ones). A slot whose mask is null is a
  // decode: exactly one row, attending to its whole visible cache. An image block must not
  // be split across chunks. Writes logits [rows wanting them, V] in row order. Every check
  // runs before any cache changes; a prompt past a cache's context fails before compute.
  void forward(const Batch& batch, std::span<const SeqSlot> slots, Activations& act, float* logits,
               const Observer* obs = nullptr) const;

  // One prompt (or chunk) through the dense mask door of PrefillInput. Returns logits
  // [rows, V]: all Lp rows when opts.all_logits, else the last valid row.
  std::vector<float> prefill_from_embeddings(const PrefillInput& in, KvCache& cache,
                                             const PrefillOptions& opts = {}) const;

  // One token for each sequence at its next position, in one forward. Writes logits
  // [batch, V]; `act` must have room for batch.size() rows. Allocates nothing once warm.
  void decode_step(std::span<const DecodeItem> batch, Activations& act, float* logits) const;
  std::vector<float> decode_step(std::span<const DecodeItem> batch) const;

 private:
  struct Layer {
    kernels::Weight q, k, v, o, gate, up, down;
    std::vector<float> input_norm, post_attn_norm, pre_ff_norm, post_ff_norm, q_norm, k_norm;
    bool sliding = false;
  };

  // One decoder layer over every row of the batch, in the block diagram's order.
  void layer(int l, const Batch& b, std::span<const SeqSlot> slots, Activations& act, const Observer* obs) const;
  // Attention of one sequence's rows [r0, r1) of the batch: new keys enter its cache.
  void attend(int l, const Batch& b, const SeqSlot& slot, size_t r0, size_t r1, Activations& act) const;

  TextConfig cfg_;
  kernels::Exec ex_;
  TextEmbedder embedder_;
  std::vector<Layer> layers_;
  std::vector<float> final_norm_;
  kernels::Weight head_;
  nn::AttnShape attn_;
  std::vector<float> inv_freq_[2];  // [0] sliding (local base, never scaled), [1] global
  float eps_ = 1e-6f;
};

}  // namespace vlm::models::gemma3
