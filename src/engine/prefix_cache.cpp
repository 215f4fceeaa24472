#include "engine/prefix_cache.h"

#include <algorithm>
#include <utility>

#include "models/mask.h"

namespace vlm::engine {

std::vector<BlockKey> block_keys(std::span<const ImageKey> images, std::span<const int> crops) {
  std::vector<BlockKey> out;
  for (size_t i = 0; i < images.size(); ++i) {
    const int parts = 1 + (i < crops.size() ? crops[i] : 0);
    for (int p = 0; p < parts; ++p) out.push_back({images[i], p, parts});
  }
  return out;
}

namespace {
struct Span {
  size_t begin, end;
};
// Where each image block lies: the mask's image groups (contiguous runs of image_id).
std::vector<Span> block_spans(std::span<const int32_t> ids, int32_t image_id) {
  const std::vector<int32_t> group = image_groups(ids, image_id);
  std::vector<Span> out;
  for (size_t i = 0; i < group.size(); ++i) {
    if (group[i] < 0) continue;
    if (size_t(group[i]) == out.size()) out.push_back({i, i});
    out.back().end = i + 1;
  }
  return out;
}

// The prompt positions that `held` (ids and blocks) supplies: where the ids agree, short of the
// last prompt row, cut before the first image whose blocks differ or are not all inside.
size_t agreeing(std::span<const int32_t> held, std::span<const BlockKey> held_blocks, std::span<const int32_t> ids,
                std::span<const BlockKey> blocks, std::span<const Span> spans) {
  const size_t limit = std::min(held.size(), ids.size() - 1);
  size_t n = 0;
  while (n < limit && held[n] == ids[n]) ++n;
  for (size_t j = 0; j < spans.size() && spans[j].begin < n; ++j) {
    const bool known = j < blocks.size() && j < held_blocks.size() && blocks[j] == held_blocks[j];
    const int part = j < blocks.size() ? blocks[j].part : 0;
    const bool last_part = j < blocks.size() && blocks[j].part + 1 == blocks[j].parts;
    const bool whole = spans[j].end <= n && (last_part || (j + 1 < spans.size() && spans[j + 1].begin < n));
    if (!known || !whole) return spans[j - size_t(std::min<size_t>(j, size_t(part)))].begin;
  }
  return n;
}
}  // namespace

size_t shared_prefix(std::span<const int32_t> held, std::span<const BlockKey> held_blocks, std::span<const int32_t> ids,
                     std::span<const BlockKey> blocks, int32_t image_id) {
  if (ids.empty()) return 0;
  return agreeing(held, held_blocks, ids, blocks, block_spans(ids, image_id));
}

void PrefixCache::put(std::vector<int32_t> ids, std::vector<BlockKey> blocks, KvCache cache,
                      std::vector<float> logits) {
  const size_t b = cache.bytes() + ids.size() * sizeof(int32_t) + blocks.size() * sizeof(BlockKey) +
                   logits.size() * sizeof(float);
  if (b > max_bytes_ || ids.empty()) return;
  // An entry this one continues (the previous turn of the same chat) holds nothing it lacks; a
  // prompt's end does (its logits, and rows the rings lose later), unless this is the same prompt.
  std::erase_if(entries_, [&](const Entry& e) {
    const bool older = e.ids.size() <= ids.size() && std::equal(e.ids.begin(), e.ids.end(), ids.begin()) &&
                       e.blocks.size() <= blocks.size() && std::equal(e.blocks.begin(), e.blocks.end(), blocks.begin()) &&
                       (e.logits.empty() || (!logits.empty() && e.ids.size() == ids.size()));
    if (older) bytes_ -= e.bytes;
    return older;
  });
  while (bytes_ + b > max_bytes_) {
    bytes_ -= entries_.back().bytes;
    entries_.pop_back();
  }
  entries_.push_front(Entry{std::move(ids), std::move(blocks), std::move(cache), std::move(logits), b});
  bytes_ += b;
}

PrefixCache::Match PrefixCache::find(std::span<const int32_t> ids, std::span<const BlockKey> blocks, int32_t image_id,
                                     const KvCache& into) {
  if (ids.empty() || entries_.empty()) return {};
  const std::vector<Span> spans = block_spans(ids, image_id);
  auto best = entries_.end();
  size_t best_n = 0;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    const size_t n = agreeing(it->ids, it->blocks, ids, blocks, spans);
    if (n > best_n && into.can_copy_prefix(it->cache, int64_t(n))) best = it, best_n = n;
  }
  if (best == entries_.end()) return {};
  entries_.splice(entries_.begin(), entries_, best);
  const size_t taken = size_t(std::count_if(spans.begin(), spans.end(), [&](const Span& b) { return b.end <= best_n; }));
  return {&entries_.front().cache, int64_t(best_n), taken};
}

PrefixCache::Prompt PrefixCache::find_prompt(std::span<const int32_t> ids, std::span<const BlockKey> blocks) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (!it->logits.empty() && std::ranges::equal(it->ids, ids) && std::ranges::equal(it->blocks, blocks)) {
      entries_.splice(entries_.begin(), entries_, it);
      return {&entries_.front().cache, &entries_.front().logits};
    }
  return {};
}

}  // namespace vlm::engine
