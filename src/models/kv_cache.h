// Keys and values of one sequence, per decoder layer (transformers HybridCache: sliding layers keep a window). Keys are stored
// after q/k-norm and RoPE, so positions are baked in and slot order does not matter
// to the math. Sliding layers keep a ring of exactly `sliding_window` slots (position
// p lives in slot p mod W); global layers append up to the context limit. Storage
// grows on demand, so a short sequence never holds a full-context buffer. Rows are f32, or bf16
// under --precision bf16 (docs/gemma3/decoder.md, "KV cache"): the element type is the cache's
// dtype, and its slots are raw rows of row_bytes().
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/huge_pages.h"
#include "io/config.h"
#include "kernels/exec.h"

namespace vlm {

class KvCache {
 public:
  // `context` is the most positions this sequence may ever hold; dtype F32 or BF16.
  KvCache(const TextConfig& cfg, int64_t context, DType dtype);
  // The most memory a cache of `context` positions ever holds (keys and values of every layer,
  // sliding layers at most their window, and `kept` overwritten rows of each: keep_overwritten):
  // what an engine reserves for a sequence.
  static size_t bytes_for(const TextConfig& cfg, int64_t context, DType dtype, int64_t kept = 0);
  // The rows a decoder keeps at a precision: bf16 under Bf16 (the keys and values a bf16
  // checkpoint's reference attends to), f32 otherwise.
  static DType dtype_for(kernels::Precision p) { return p == kernels::Precision::Bf16 ? DType::BF16 : DType::F32; }

  int64_t length() const { return length_; }  // positions written = next position
  int64_t context() const { return context_; }
  size_t row_size() const { return row_; }    // nKV · d values per position
  DType dtype() const { return dtype_; }
  size_t row_bytes() const { return row_ * dtype_size(dtype_); }

  // Makes room for positions [length, length + n) in every layer; fails past the context.
  void reserve(int64_t n);
  // Where position `pos` (< length + reserved) is written in layer `layer`.
  std::byte* key_slot(int layer, int64_t pos);
  std::byte* value_slot(int layer, int64_t pos);
  // Marks n more positions as written.
  void advance(int64_t n);
  // Drops positions [n, length): the rows of a draft the model did not take (docs/gemma3/decoder.md,
  // "Drafts"). The sliding layers' rings get back the rows those overwrote, from the log of
  // overwritten rows; fails where the log no longer holds one.
  void rewind(int64_t n);
  // The most positions of a next reserve() that rewind() can always give back: the rows the log
  // keeps (any number without sliding layers).
  int64_t max_rewind() const { return ring_size() == 0 ? context_ : keep_; }
  // Lowers the most positions this cache may hold (to what its sequence can still use), never
  // below what it holds.
  void limit_context(int64_t context);

  // Slots holding the keys visible to a query once `positions` positions are written
  // (the query's own included): all of them for global layers, the last min(positions, W)
  // for sliding ones. Those slots are 0 .. visible − 1.
  size_t visible(int layer, int64_t positions) const;

  // Keeps the last `rows` positions that leave the sliding layers' rings (the rows they held,
  // copied just before a step or prefill chunk overwrites them, and a long chunk's rows that pass
  // the rings without entering them), so that a prefix a little shorter than this cache can still
  // be copied from it: a chat's next prompt repeats the answer as text, and the template trims it;
  // an edited last message repeats the prompt up to that message. Call before the first reserve();
  // bytes() counts the log.
  void keep_overwritten(int64_t rows);
  // The positions before the rings that the log holds now (0 without one).
  int64_t logged() const;
  // Where a sliding layer's row at `pos` goes that passes its ring without entering it (the first
  // rows of a prefill chunk longer than the window), between reserve() and advance(): a row of the
  // log, or null where the log does not keep that position.
  std::byte* logged_key_slot(int layer, int64_t pos);
  std::byte* logged_value_slot(int layer, int64_t pos);
  // Whether `from` (a cache of the same model) still holds every row this cache needs to go on
  // from position n: n past this cache's length and within both caches' limits and `from`'s
  // length, and in sliding layers the last window before n, in `from`'s ring or its log of
  // overwritten rows.
  bool can_copy_prefix(const KvCache& from, int64_t n) const;
  // Copies those rows (can_copy_prefix, else fails), over any this cache held; it then holds
  // positions [0, n). With a log, it also copies what `from` holds of the positions before its
  // rings, as many as its log keeps.
  void copy_prefix(const KvCache& from, int64_t n);
  // The memory its rows take now (grown on demand: at most bytes_for its context).
  size_t bytes() const;
  const std::byte* keys(int layer) const { return layers_[layer].k.data(); }
  const std::byte* values(int layer) const { return layers_[layer].v.data(); }

 private:
  struct Layer {
    bool sliding = false;
    size_t cap = 0;  // W for sliding layers, context for global ones
    // In huge pages where large: a 512-token prompt's keys and values of a 4B model are 140 MB,
    // which in 4 KiB pages were 34 000 page faults (core/huge_pages.h).
    HugePageVector<std::byte> k, v;
    std::vector<std::byte> old_k, old_v;  // keep_overwritten's log, position p at row p mod keep_
  };
  size_t slot(int layer, int64_t pos) const;
  int sliding_layer() const;  // the first, -1 for none
  int64_t ring_size() const;  // the sliding layers' ring (0 for none)
  std::byte* logged_slot(std::vector<std::byte> Layer::*log, int layer, int64_t pos);
  // The first position layer l can give back (ring, then log), and where position pos lies: in
  // the layer's keys or values `ring`, or in their `log`.
  int64_t first_held(int layer) const;
  const std::byte* held_row(const HugePageVector<std::byte>& ring, const std::vector<std::byte>& log, int layer,
                            int64_t pos) const;

  std::vector<Layer> layers_;
  size_t row_ = 0;
  DType dtype_ = DType::F32;
  int64_t length_ = 0;
  int64_t context_ = 0;
  int64_t keep_ = 0, log_lo_ = 0, log_hi_ = 0;  // the log holds positions [log_lo_, log_hi_)
};

}  // namespace vlm
