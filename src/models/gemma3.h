// The Gemma 3 text decoder (spec §10–§11). Weights are views of the checkpoint's
// stored tensors (bf16/f16/f32, never copied to f32 except the small norm vectors);
// activations are f32.
//
// One prefill door: prefill_from_embeddings() takes post-scale embeddings and the
// additive masks, for text and multimodal prompts alike. decode_step() appends one
// token per sequence over its KV cache, without a mask.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/thread_pool.h"
#include "engine/kv_cache.h"
#include "io/checkpoint.h"
#include "kernels/matmul.h"
#include "models/attention.h"
#include "models/prefill_input.h"
#include "multimodal/merge.h"

namespace vlm {

struct PrefillOptions {
  bool all_logits = false;  // logits for every row (else only row valid_len − 1)
  // Called with the residual stream [Lp, H] after each decoder layer (for dumps).
  std::function<void(int layer, const float* hidden)> on_layer;
};

struct DecodeItem {
  KvCache* cache;
  int32_t token;
};

class Gemma3 {
 public:
  Gemma3(const Checkpoint& ckpt, ThreadPool& pool, EmbedScaling scaling = EmbedScaling::Reference);

  const TextConfig& config() const { return cfg_; }
  const TextEmbedder& embedder() const { return embedder_; }
  int vocab() const { return int(head_.rows); }
  ThreadPool& pool() { return pool_; }
  KvCache new_cache(int64_t context) const { return KvCache(cfg_, context); }

  // Runs the prompt through every layer and appends its valid_len real positions to
  // `cache`. On a non-empty cache this is a continuation (a later chunk or turn): row i
  // gets position length() + i, every valid row also sees the cached keys (all of them
  // on global layers, those within the window on sliding ones), and `in`'s masks cover
  // only the new rows. An image block must not be split across chunks. Returns logits
  // [rows, V]: all Lp rows when opts.all_logits, else the last valid row.
  std::vector<float> prefill_from_embeddings(const PrefillInput& in, KvCache& cache,
                                             const PrefillOptions& opts = {});

  // One token for each sequence at its next position; returns logits [batch, V].
  std::vector<float> decode_step(std::span<const DecodeItem> batch);

 private:
  struct Layer {
    kernels::Weight q, k, v, o, gate, up, down;
    std::vector<float> input_norm, post_attn_norm, pre_ff_norm, post_ff_norm, q_norm, k_norm;
    bool sliding = false;
  };

  // Rows [n, H] through the attention input side: q [n, nH·d], k/v [n, nKV·d] with norms
  // and RoPE at positions pos[0..n) applied.
  void project_qkv(const Layer& L, const float* x, size_t n, const int64_t* pos, float* q,
                   float* k, float* v);
  // x += post_attn_norm(o · Woᵀ), then the MLP sublayer, for n rows.
  void finish_layer(const Layer& L, float* x, const float* attn, size_t n);
  std::vector<float> head(const float* x, size_t n);
  // For a continuation at P cached positions: cached then new keys/values of `layer`
  // and the mask [Lp, cached + Lp] over them; returns the number of cached keys.
  size_t continuation_keys(const KvCache& cache, int layer, int64_t P, const PrefillInput& in,
                           const std::vector<float>& mask, const std::vector<float>& k,
                           const std::vector<float>& v, std::vector<float>& keys,
                           std::vector<float>& values, std::vector<float>& mask_ext) const;
  const std::vector<float>& inv_freq(bool sliding) const {
    return sliding ? inv_freq_local_ : inv_freq_global_;
  }

  TextConfig cfg_;
  ThreadPool& pool_;
  TextEmbedder embedder_;
  std::vector<Layer> layers_;
  std::vector<float> final_norm_;
  kernels::Weight head_;
  models::AttnShape attn_;
  std::vector<float> inv_freq_local_, inv_freq_global_;
  float eps_ = 1e-6f;
  // Per-layer work rows, kept between layers and calls so the per-token path allocates
  // nothing (resize only grows them).
  struct Scratch {
    std::vector<float> a, t, gate, up, cos, sin;
  } scratch_;
};

}  // namespace vlm
