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

size_t KvCache::bytes_for(const TextConfig& cfg, int64_t context, DType dtype, int64_t kept) {
  size_t slots = 0;
  for (int l = 0; l < cfg.num_layers; ++l)
    slots += size_t(cfg.layer_kinds.at(size_t(l)) == LayerKind::Sliding
                        ? std::min<int64_t>(cfg.sliding_window, context) + (context > cfg.sliding_window ? kept : 0)
                        : context);
  return slots * size_t(cfg.num_kv_heads) * size_t(cfg.head_dim) * 2 * dtype_size(dtype);
}

void KvCache::reserve(int64_t n) {
  const int64_t need = length_ + n;
  if (need > context_)
    fail("KV cache: {} positions exceed the context limit of {}", need, context_);
  const size_t row = row_bytes();
  for (Layer& L : layers_) {
    const size_t slots = std::min(L.cap, size_t(need));
    if (L.k.size() >= slots * row) continue;
    // Geometric growth keeps appends amortised O(1) without a full-context allocation.
    size_t grow = std::min(L.cap, std::max(slots, L.k.size() / row * 2));
    L.k.resize(grow * row);
    L.v.resize(grow * row);
  }
  if (keep_ == 0) return;
  // Positions [length − W, length + n − W) leave the rings with these n rows. Those the rings hold
  // are logged now, before anything overwrites them; the later ones (a chunk longer than the
  // window) never enter the rings, and the decoder writes them to the log (logged_key_slot).
  const int64_t W = ring_size();
  const int64_t lo = std::max<int64_t>(0, length_ - W), hi = length_ + n - W;
  if (W == 0 || hi <= lo) return;
  if (log_hi_ != lo) log_lo_ = lo;  // not contiguous with what the log holds
  log_hi_ = hi;
  log_lo_ = std::max(log_lo_, log_hi_ - keep_);
  for (size_t l = 0; l < layers_.size(); ++l) {
    Layer& L = layers_[l];
    if (!L.sliding) continue;
    if (L.old_k.empty()) L.old_k.resize(size_t(keep_) * row), L.old_v.resize(size_t(keep_) * row);
    for (int64_t p = std::max(lo, log_lo_); p < std::min(length_, hi); ++p) {
      std::copy_n(key_slot(int(l), p), row, L.old_k.data() + size_t(p % keep_) * row);
      std::copy_n(value_slot(int(l), p), row, L.old_v.data() + size_t(p % keep_) * row);
    }
  }
}

void KvCache::keep_overwritten(int64_t rows) {
  if (rows < 0 || length_ != 0) fail("KV cache: keep_overwritten({}) on a cache of {} positions", rows, length_);
  keep_ = rows;
}

int KvCache::sliding_layer() const {
  for (size_t l = 0; l < layers_.size(); ++l)
    if (layers_[l].sliding) return int(l);
  return -1;
}

int64_t KvCache::ring_size() const {
  const int l = sliding_layer();  // every sliding layer has the same ring
  return l < 0 ? 0 : int64_t(layers_[size_t(l)].cap);
}

int64_t KvCache::logged() const {
  const int64_t ring = length_ - std::min(ring_size(), length_);
  return log_hi_ == ring && log_lo_ < log_hi_ ? log_hi_ - log_lo_ : 0;
}

std::byte* KvCache::logged_slot(std::vector<std::byte> Layer::*log, int layer, int64_t pos) {
  Layer& L = layers_[size_t(layer)];
  if (!L.sliding || pos < log_lo_ || pos >= log_hi_ || (L.*log).empty()) return nullptr;
  return (L.*log).data() + size_t(pos % keep_) * row_bytes();
}
std::byte* KvCache::logged_key_slot(int layer, int64_t pos) { return logged_slot(&Layer::old_k, layer, pos); }
std::byte* KvCache::logged_value_slot(int layer, int64_t pos) { return logged_slot(&Layer::old_v, layer, pos); }

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

void KvCache::rewind(int64_t n) {
  if (n < 0 || n > length_) fail("KV cache: cannot go back to {} positions from {}", n, length_);
  // The rings' slots of positions [n, length) held positions [n − W, length − W) before; those
  // the rings hold again come back from the log.
  const int64_t W = ring_size(), lo = std::max<int64_t>(0, n - W), hi = length_ - W;
  if (W > 0 && hi > lo) {
    if (lo < log_lo_ || hi > log_hi_)
      fail("KV cache: going back to {} positions needs positions {}..{} that left the rings; the log holds {}..{}", n,
           lo, hi - 1, log_lo_, log_hi_ - 1);
    const size_t row = row_bytes();
    for (size_t l = 0; l < layers_.size(); ++l) {
      Layer& L = layers_[l];
      if (!L.sliding) continue;
      for (int64_t p = lo; p < hi; ++p) {
        std::copy_n(L.old_k.data() + size_t(p % keep_) * row, row, key_slot(int(l), p));
        std::copy_n(L.old_v.data() + size_t(p % keep_) * row, row, value_slot(int(l), p));
      }
    }
    log_hi_ = lo;  // those positions are in the rings again
    log_lo_ = std::min(log_lo_, log_hi_);
  }
  length_ = n;
}

void KvCache::limit_context(int64_t context) {
  if (context < length_ || context > context_)
    fail("KV cache: context {} outside [{}, {}] (its length and its limit)", context, length_, context_);
  context_ = context;
  for (Layer& L : layers_) L.cap = std::min(L.cap, size_t(context));
}

size_t KvCache::visible(int layer, int64_t positions) const {
  return std::min(layers_[size_t(layer)].cap, size_t(positions));
}

int64_t KvCache::first_held(int layer) const {
  const int64_t ring = length_ - int64_t(visible(layer, length_));
  const bool logged = layers_[size_t(layer)].sliding && log_hi_ == ring && log_lo_ < log_hi_;
  return logged ? log_lo_ : ring;
}

const std::byte* KvCache::held_row(const HugePageVector<std::byte>& ring, const std::vector<std::byte>& log, int layer,
                                   int64_t pos) const {
  return pos >= length_ - int64_t(visible(layer, length_)) ? ring.data() + slot(layer, pos) * row_bytes()
                                                           : log.data() + size_t(pos % keep_) * row_bytes();
}

bool KvCache::can_copy_prefix(const KvCache& from, int64_t n) const {
  if (n <= length_ || n > from.length_ || n > context_ || from.row_ != row_ || from.dtype_ != dtype_ ||
      from.layers_.size() != layers_.size())
    return false;
  for (size_t l = 0; l < layers_.size(); ++l)  // positions [n - visible, n) are needed
    if (layers_[l].sliding != from.layers_[l].sliding || n - int64_t(visible(int(l), n)) < from.first_held(int(l)))
      return false;
  return true;
}

void KvCache::copy_prefix(const KvCache& from, int64_t n) {
  if (!can_copy_prefix(from, n)) fail("KV cache: cannot take {} positions from a cache of {}", n, from.length_);
  length_ = 0;  // every row it needs is copied, over what it held
  reserve(n);
  // With a log, the rows before the rings come too, as far as it keeps them and `from` holds them.
  const int64_t W = ring_size(), ring = n - std::min(W, n);
  log_lo_ = log_hi_ = 0;
  if (keep_ > 0 && W > 0 && ring > 0) {
    log_hi_ = ring;
    log_lo_ = std::max({int64_t(0), ring - keep_, from.first_held(sliding_layer())});
  }
  const size_t row = row_bytes();
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& F = from.layers_[l];
    const int64_t first = n - int64_t(visible(int(l), n));
    const bool log = layers_[l].sliding && log_lo_ < log_hi_;  // its rows were allocated by reserve(n)
    for (int64_t p = log ? log_lo_ : first; p < n; ++p) {  // slot by slot: the rings' sizes may differ
      std::byte* k = p < first ? logged_key_slot(int(l), p) : key_slot(int(l), p);
      std::byte* v = p < first ? logged_value_slot(int(l), p) : value_slot(int(l), p);
      std::copy_n(from.held_row(F.k, F.old_k, int(l), p), row, k);
      std::copy_n(from.held_row(F.v, F.old_v, int(l), p), row, v);
    }
  }
  length_ = n;
}

size_t KvCache::bytes() const {
  size_t b = 0;
  for (const Layer& L : layers_) b += L.k.size() + L.v.size() + L.old_k.size() + L.old_v.size();
  return b;
}

}  // namespace vlm
