#include "engine/prompt_cache.h"

#include <cstring>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace vlm {

namespace {
constexpr char kMagic[8] = {'V', 'L', 'M', 'P', 'C', 0, 0, 1};
constexpr uint64_t kMaxHeader = 1 << 20;

std::string hex(uint64_t h) { return fmt::format("{:016x}", h); }
}  // namespace

uint64_t request_hash(std::span<const int32_t> ids, const std::vector<vision::RgbImage>& images) {
  uint64_t h = fnv1a64(ids.data(), ids.size_bytes());
  for (const vision::RgbImage& im : images) {
    const int32_t wh[2] = {im.width, im.height};
    h = fnv1a64(wh, sizeof wh, h);
    h = fnv1a64(im.rgb.data(), im.rgb.size(), h);
  }
  return h;
}

void save_prompt_cache(const std::filesystem::path& file, const Identity& id, uint64_t request,
                       const TextConfig& cfg, KvCache& cache, std::span<const float> last_logits) {
  const int64_t len = cache.length();
  const int layers = cfg.num_layers;
  nlohmann::json vis = nlohmann::json::array();
  for (int l = 0; l < layers; ++l) vis.push_back(cache.visible(l, len));
  const std::string header = nlohmann::json{{"identity", identity_to_json(id)}, {"request", hex(request)},
                                            {"length", len}, {"vocab", last_logits.size()},
                                            {"row", cache.row_size()}, {"visible", vis}}
                                 .dump();
  // Written to a temporary name first, so a crash never leaves a half file under `file`.
  const std::filesystem::path tmp = file.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    const uint64_t n = header.size();
    f.write(kMagic, sizeof kMagic);
    f.write(reinterpret_cast<const char*>(&n), sizeof n);
    f.write(header.data(), std::streamsize(n));
    f.write(reinterpret_cast<const char*>(last_logits.data()), std::streamsize(last_logits.size_bytes()));
    const std::streamsize row = std::streamsize(cache.row_size() * sizeof(float));
    // Sliding layers keep only their window; positions are written oldest first.
    for (int l = 0; l < layers; ++l)
      for (float* (KvCache::*slot)(int, int64_t) : {&KvCache::key_slot, &KvCache::value_slot})
        for (int64_t p = len - int64_t(cache.visible(l, len)); p < len; ++p)
          f.write(reinterpret_cast<const char*>((cache.*slot)(l, p)), row);
    if (!f) fail("--prompt-cache: cannot write {}", tmp.string());
  }
  std::filesystem::rename(tmp, file);
}

std::optional<SavedPrefill> load_prompt_cache(const std::filesystem::path& file, const Identity& id,
                                              uint64_t request, const TextConfig& cfg, int64_t context,
                                              int vocab) {
  const std::string where = file.string();
  std::ifstream f(file, std::ios::binary);
  if (!f) fail("--prompt-cache: cannot read {}", where);
  char magic[sizeof kMagic];
  uint64_t n = 0;
  if (!f.read(magic, sizeof magic) || std::memcmp(magic, kMagic, sizeof kMagic) != 0)
    fail("{}: not a vlm prompt cache (bad magic)", where);
  if (!f.read(reinterpret_cast<char*>(&n), sizeof n) || n > kMaxHeader)
    fail("{}: bad header length", where);
  std::string text(n, '\0');
  if (!f.read(text.data(), std::streamsize(n))) fail("{}: truncated header", where);
  const nlohmann::json h = nlohmann::json::parse(text, nullptr, false);
  if (h.is_discarded() || !h.is_object()) fail("{}: the header is not JSON", where);
  require_same_identity(identity_from_json(h.value("identity", nlohmann::json()), where), id, where);
  if (h.value("request", std::string()) != hex(request)) return std::nullopt;

  KvCache cache(cfg, context);
  const int64_t len = h.value("length", int64_t(-1));
  const nlohmann::json vis = h.value("visible", nlohmann::json());
  if (len <= 0 || len > context) fail("{}: length {} outside (0, {}]", where, len, context);
  if (h.value("vocab", -1) != vocab || h.value("row", size_t(0)) != cache.row_size() || !vis.is_array() ||
      vis.size() != size_t(cfg.num_layers))
    fail("{}: shapes do not match the model", where);
  SavedPrefill s{std::move(cache), std::vector<float>(size_t(vocab))};
  if (!f.read(reinterpret_cast<char*>(s.logits.data()), std::streamsize(s.logits.size() * sizeof(float))))
    fail("{}: truncated", where);
  s.cache.reserve(len);
  const std::streamsize row = std::streamsize(s.cache.row_size() * sizeof(float));
  for (int l = 0; l < cfg.num_layers; ++l) {
    const int64_t v = vis[size_t(l)].is_number_integer() ? vis[size_t(l)].get<int64_t>() : -1;
    if (v != int64_t(s.cache.visible(l, len))) fail("{}: layer {} holds {} positions", where, l, v);
    for (float* (KvCache::*slot)(int, int64_t) : {&KvCache::key_slot, &KvCache::value_slot})
      for (int64_t p = len - v; p < len; ++p)
        if (!f.read(reinterpret_cast<char*>((s.cache.*slot)(l, p)), row)) fail("{}: truncated", where);
  }
  if (f.peek() != std::char_traits<char>::eof()) fail("{}: trailing bytes", where);
  s.cache.advance(len);
  return s;
}

}  // namespace vlm
