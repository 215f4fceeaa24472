// KV caches of finished sequences, kept so that a later prompt that begins with the same tokens
// and the same images starts from their rows instead of computing them again: every turn of a
// chat sends the whole conversation, so its prompt is the previous prompt, the previous answer
// and the new message. What a new sequence may take (PrefixCache::find): the positions where the
// token ids agree, never into an image block whose image differs (equal ids hold any image: the
// blocks are compared by their images' keys) and never part of an image's blocks (image rows
// attend to each other within a block, so a block's rows depend on all of it), and never the
// prompt's last row, whose logits the sequence needs. A prefix's rows depend only on the tokens
// and images before them (the causal mask, the image blocks kept whole), so taking them gives
// the rows a fresh prefill gives, up to the summation order of the kernels that made them (a
// previous answer's rows came from decode steps): within 1e-5 of the largest logit
// (tests/unit/engine_test.cpp). Not used under the mlx mask mode, where every prompt row sees
// the whole prompt.
//
// A sliding layer's ring keeps only its last W positions, so a finished sequence cannot give back
// a prefix that ends more than a little before its end once it passed W (a regenerated answer
// repeats the prompt of one that ran long). So the cache also keeps prompts where their prefill
// ended, each with the logits of its last row: the same prompt again (ids and images) starts
// decoding from them with nothing computed (find_prompt), as llama.cpp's server keeps its SWA
// layers' cells where a prompt ended.
#pragma once
#include <cstddef>
#include <cstdint>
#include <list>
#include <span>
#include <vector>

#include "engine/image_cache.h"
#include "models/kv_cache.h"

namespace vlm::engine {

// One image block of a prompt: which image (its key) and which of its blocks (0, then its Pan &
// Scan crops; `parts` in all).
struct BlockKey {
  ImageKey image{};
  int part = 0, parts = 1;
  bool operator==(const BlockKey&) const = default;
};
// The blocks of images with `crops` Pan & Scan crops each, in prompt order.
std::vector<BlockKey> block_keys(std::span<const ImageKey> images, std::span<const int> crops);

// The positions of a prompt (`ids`, its image blocks `blocks`) that a cache holding `held` (the ids
// at its positions, its image blocks `held_blocks`) supplies, as the header says.
size_t shared_prefix(std::span<const int32_t> held, std::span<const BlockKey> held_blocks,
                     std::span<const int32_t> ids, std::span<const BlockKey> blocks, int32_t image_id);

// Least recently used entries go first once the caches held pass max_bytes (0: holds nothing).
// Not thread-safe: the engine's thread alone uses it.
class PrefixCache {
 public:
  explicit PrefixCache(size_t max_bytes) : max_bytes_(max_bytes) {}
  // Keeps a finished sequence's cache: `ids` are the tokens at its positions, `blocks` the image
  // blocks among them in order. With `logits` (those of its last row), a prompt's cache where its
  // prefill ended, for find_prompt.
  void put(std::vector<int32_t> ids, std::vector<BlockKey> blocks, KvCache cache, std::vector<float> logits = {});
  struct Match {
    const KvCache* cache = nullptr;
    int64_t positions = 0;  // 0: nothing to take
    size_t blocks = 0;      // the image blocks among them (whole images)
  };
  // The entry with the most positions that `into` may copy (more than it holds) for a prompt `ids`
  // with image blocks `blocks` (runs of image_id), as the header says; that entry becomes the
  // most recently used.
  Match find(std::span<const int32_t> ids, std::span<const BlockKey> blocks, int32_t image_id, const KvCache& into);
  // A prompt kept where its prefill ended, with exactly these ids and image blocks: its cache and
  // the logits of its last row (it becomes the most recently used); nulls when there is none.
  struct Prompt {
    const KvCache* cache = nullptr;
    const std::vector<float>* logits = nullptr;
  };
  Prompt find_prompt(std::span<const int32_t> ids, std::span<const BlockKey> blocks);
  size_t bytes() const { return bytes_; }
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::vector<int32_t> ids;
    std::vector<BlockKey> blocks;
    KvCache cache;
    std::vector<float> logits;  // a prompt's end: its last row's logits
    size_t bytes;
  };
  size_t max_bytes_, bytes_ = 0;
  std::list<Entry> entries_;  // most recently used first
};

}  // namespace vlm::engine
