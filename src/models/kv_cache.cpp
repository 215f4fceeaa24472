#include "models/kv_cache.h"

#include <algorithm>

#include "core/error.h"

namespace vlm {

KvCache::KvCache(const TextConfig& cfg, int64_t context, DType dtype)
    : row_(size_t(cfg.num_kv_heads) * size_t(cfg.head_dim)), dtype_(dtype), context_(context) {
  if (context <= 0) fail("KV cache: context must be positive, got {}", context);
  if (dtype != DType::F32 && dtype != DType::BF16) fail("KV cache: rows are F32 or BF16, not {}", dtype_name(dtype));
  layers_.resize(size_t(cfg.num_layers));
  for (int l = 0; l < cfg.num_layers; ++l) {
    Layer& L = layers_[size_t(l)];
    L.sliding = cfg.layer_kinds.at(size_t(l)) == LayerKind::Sliding;
    L.cap = L.sliding ? size_t(std::min<int64_t>(cfg.sliding_window, context)) : size_t(context);
  }
}

size_t KvCache::bytes_for(const TextConfig& cfg, int64_t context, DType dtype) {
  size_t slots = 0;
  for (int l = 0; l < cfg.num_layers; ++l)
    slots += size_t(cfg.layer_kinds.at(size_t(l)) == LayerKind::Sliding ? std::min<int64_t>(cfg.sliding_window, context)
                                                                          : context);
  return slots * size_t(cfg.num_kv_heads) * size_t(cfg.head_dim) * 2 * dtype_size(dtype);
}

void KvCache::reserve(int64_t n) {
  const int64_t need = length_ + n;
  if (need > context_)
    fail("KV cache: {} positions exceed the context limit of {}", need, context_);
  for (Layer& L : layers_) {
    const size_t slots = std::min(L.cap, size_t(need));
    const size_t row = row_bytes();
    if (L.k.size() >= slots * row) continue;
    // Geometric growth keeps appends amortised O(1) without a full-context allocation.
    size_t grow = std::min(L.cap, std::max(slots, L.k.size() / row * 2));
    L.k.resize(grow * row);
    L.v.resize(grow * row);
  }
}

size_t KvCache::slot(int layer, int64_t pos) const {
  const Layer& L = layers_[size_t(layer)];
  return L.sliding ? size_t(pos) % L.cap : size_t(pos);
}

std::byte* KvCache::key_slot(int layer, int64_t pos) {
  return layers_[size_t(layer)].k.data() + slot(layer, pos) * row_bytes();
}
std::byte* KvCache::value_slot(int layer, int64_t pos) {
  return layers_[size_t(layer)].v.data() + slot(layer, pos) * row_bytes();
}

void KvCache::advance(int64_t n) { length_ += n; }

void KvCache::limit_context(int64_t context) {
  if (context < length_ || context > context_)
    fail("KV cache: context {} outside [{}, {}] (its length and its limit)", context, length_, context_);
  context_ = context;
  for (Layer& L : layers_) L.cap = std::min(L.cap, size_t(context));
}

size_t KvCache::visible(int layer, int64_t positions) const {
  return std::min(layers_[size_t(layer)].cap, size_t(positions));
}

bool KvCache::can_copy_prefix(const KvCache& from, int64_t n) const {
  if (length_ != 0 || n <= 0 || n > from.length_ || n > context_ || from.row_ != row_ || from.dtype_ != dtype_ ||
      from.layers_.size() != layers_.size())
    return false;
  for (size_t l = 0; l < layers_.size(); ++l) {
    // Positions [n - visible, n) are needed; `from` holds [its length - its visible, its length).
    const int64_t need = n - int64_t(visible(int(l), n)), held = from.length_ - int64_t(from.visible(int(l), from.length_));
    if (layers_[l].sliding != from.layers_[l].sliding || need < held) return false;
  }
  return true;
}

void KvCache::copy_prefix(const KvCache& from, int64_t n) {
  if (!can_copy_prefix(from, n)) fail("KV cache: cannot take {} positions from a cache of {}", n, from.length_);
  reserve(n);
  const size_t row = row_bytes();
  for (size_t l = 0; l < layers_.size(); ++l)
    for (int64_t p = n - int64_t(visible(int(l), n)); p < n; ++p) {  // slot by slot: the rings' sizes may differ
      std::copy_n(from.layers_[l].k.data() + from.slot(int(l), p) * row, row, layers_[l].k.data() + slot(int(l), p) * row);
      std::copy_n(from.layers_[l].v.data() + from.slot(int(l), p) * row, row, layers_[l].v.data() + slot(int(l), p) * row);
    }
  length_ = n;
}

size_t KvCache::bytes() const {
  size_t b = 0;
  for (const Layer& L : layers_) b += L.k.size() + L.v.size();
  return b;
}

}  // namespace vlm
