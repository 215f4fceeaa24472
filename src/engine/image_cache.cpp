#include "engine/image_cache.h"

#include <openssl/evp.h>

#include <cstring>
#include <memory>

#include "core/error.h"

namespace vlm::engine {

ImageKey image_key(const vision::RgbImage& im) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  const int64_t wh[2] = {im.width, im.height};
  ImageKey key{};
  unsigned int n = 0;
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1 ||
      EVP_DigestUpdate(ctx.get(), wh, sizeof wh) != 1 || EVP_DigestUpdate(ctx.get(), im.rgb.data(), im.rgb.size()) != 1 ||
      EVP_DigestFinal_ex(ctx.get(), key.data(), &n) != 1 || n != key.size())
    fail("image_key: SHA-256 failed (OpenSSL)");
  return key;
}

size_t ImageCache::Hash::operator()(const ImageKey& k) const {
  size_t h;
  std::memcpy(&h, k.data(), sizeof h);  // the digest's bytes are already uniform
  return h;
}

const std::vector<float>* ImageCache::find(const ImageKey& key) {
  const auto it = index_.find(key);
  if (it == index_.end()) return nullptr;
  entries_.splice(entries_.begin(), entries_, it->second);
  return &it->second->rows;
}

void ImageCache::put(const ImageKey& key, const std::vector<float>& rows) {
  const size_t b = rows.size() * sizeof(float);
  if (b > max_bytes_ || index_.contains(key)) return;
  while (bytes_ + b > max_bytes_) {
    bytes_ -= entries_.back().rows.size() * sizeof(float);
    index_.erase(entries_.back().key);
    entries_.pop_back();
  }
  entries_.push_front(Entry{key, rows});
  index_.emplace(key, entries_.begin());
  bytes_ += b;
}

}  // namespace vlm::engine
