// Projector rows of recently encoded images, kept for reuse: a chat client sends the whole
// conversation again every turn, images included, and without this each turn would run the
// vision tower again for the same picture (seconds per image on a CPU). The rows depend only on
// the image's pixels and on the model (its preprocessing, Pan & Scan option, precision), so one
// cache serves one Engine; an entry is the encode's exact output, so a reuse changes no bit of
// what follows (tests/unit/engine_test.cpp). Keys are SHA-256 digests of the pixels: a client
// cannot craft an image that takes another image's entry.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "vision/image.h"

namespace vlm::engine {

using ImageKey = std::array<uint8_t, 32>;
// SHA-256 over the width, the height and the RGB bytes.
ImageKey image_key(const vision::RgbImage& im);

// Least recently used entries go first once the rows held pass max_bytes (0: holds nothing).
// Not thread-safe: the engine's thread alone uses it.
class ImageCache {
 public:
  explicit ImageCache(size_t max_bytes) : max_bytes_(max_bytes) {}
  // The rows stored under `key` (now the most recently used), or null.
  const std::vector<float>* find(const ImageKey& key);
  // Stores a copy of `rows` under `key` unless it alone exceeds max_bytes; evicts as needed.
  void put(const ImageKey& key, const std::vector<float>& rows);
  size_t bytes() const { return bytes_; }
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    ImageKey key;
    std::vector<float> rows;
  };
  struct Hash {
    size_t operator()(const ImageKey& k) const;
  };
  size_t max_bytes_, bytes_ = 0;
  std::list<Entry> entries_;  // most recently used first
  std::unordered_map<ImageKey, std::list<Entry>::iterator, Hash> index_;
};

}  // namespace vlm::engine
