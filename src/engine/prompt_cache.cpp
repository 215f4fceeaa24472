#include "engine/prompt_cache.h"

#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/file.h"
#include "io/json.h"

namespace vlm {

namespace {
// The last byte is the format version: 2 added the checksum and the size checks.
constexpr char kMagic[8] = {'V', 'L', 'M', 'P', 'C', 0, 0, 2};
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

// Layout: magic[8], u64 n, n bytes of JSON header, the last prompt row's logits (vocab
// f32), then per layer its keys and its values (the visible positions, oldest first, row
// f32 each), then a u64 checksum64 over everything from the header on. The header
// states every size, so a file is checked against its real size before any allocation.
void save_prompt_cache(const std::filesystem::path& file, const Identity& id, uint64_t request,
                       const TextConfig& cfg, KvCache& cache, std::span<const float> last_logits) {
  const int64_t len = cache.length();
  const int layers = cfg.num_layers;
  nlohmann::json vis = nlohmann::json::array();
  for (int l = 0; l < layers; ++l) vis.push_back(cache.visible(l, len));
  const std::string header = nlohmann::json{{"identity", identity_to_json(id)}, {"request", hex(request)},
                                            {"length", len}, {"vocab", last_logits.size()},
                                            {"row", cache.row_size()}, {"kv", dtype_name(cache.dtype())},
                                            {"visible", vis}}
                                 .dump();
  // Written to a fresh temporary and renamed, so a crash never leaves a half file under
  // `file` and a planted symlink is never followed (io/file.h).
  AtomicWriter f(file);
  const uint64_t n = header.size();
  f.write(kMagic, sizeof kMagic);
  f.write(&n, sizeof n);
  uint64_t sum = checksum64(header.data(), header.size());
  auto put = [&](const void* p, size_t bytes) {
    f.write(p, bytes);
    sum = checksum64(p, bytes, sum);
  };
  f.write(header);
  put(last_logits.data(), last_logits.size_bytes());
  const size_t row = cache.row_bytes();
  // Sliding layers keep only their window; positions are written oldest first.
  for (int l = 0; l < layers; ++l)
    for (std::byte* (KvCache::*slot)(int, int64_t) : {&KvCache::key_slot, &KvCache::value_slot})
      for (int64_t p = len - int64_t(cache.visible(l, len)); p < len; ++p) put((cache.*slot)(l, p), row);
  f.write(&sum, sizeof sum);
  f.commit();
}

std::optional<SavedPrefill> load_prompt_cache(const std::filesystem::path& file, const Identity& id,
                                              uint64_t request, const TextConfig& cfg, int64_t context,
                                              DType kv, int vocab) {
  const InputFile f(file);
  const std::string& where = f.where();
  const uint64_t size = f.size();
  char magic[sizeof kMagic];
  if (size < sizeof kMagic || (f.read_at(magic, sizeof magic, 0), std::memcmp(magic, kMagic, sizeof kMagic) != 0))
    fail("{}: not a vlm prompt cache (bad magic)", where);
  constexpr uint64_t kFixed = sizeof kMagic + 8 + 8;  // magic, header length, checksum
  if (size < kFixed) fail("{}: truncated: {} bytes", where, size);
  uint64_t n = 0;
  f.read_at(&n, sizeof n, sizeof kMagic);
  if (n > kMaxHeader) fail("{}: header length {} exceeds the limit of {}", where, n, kMaxHeader);
  if (n > size - kFixed) fail("{}: truncated: header of {} bytes in a file of {}", where, n, size);
  std::string text(n, '\0');
  f.read_at(text.data(), text.size(), sizeof kMagic + 8);
  const nlohmann::json h = parse_json(text, where + ": header", 8);
  if (!h.is_object()) fail("{}: the header is not a JSON object", where);
  require_same_identity(identity_from_json(h.value("identity", nlohmann::json()), where), id, where);
  if (!h.contains("request") || !h["request"].is_string()) fail("{}: header field 'request' is not a string", where);
  if (h["request"].get<std::string>() != hex(request)) return std::nullopt;

  // The limits a fresh prompt meets (Engine admission, engine/engine.cpp) hold for a saved one too.
  if (context <= 0 || context > cfg.max_position_embeddings)
    fail("{}: context {} outside (0, max_position_embeddings {}]", where, context, cfg.max_position_embeddings);
  auto integer = [&](const char* key) {
    const nlohmann::json& v = h.contains(key) ? h[key] : nlohmann::json();
    if (!v.is_number_integer()) fail("{}: header field '{}' is missing or not an integer", where, key);
    return v.get<int64_t>();
  };
  const int64_t len = integer("length");
  if (len <= 0 || len > context) fail("{}: length {} outside (0, {}] (the context limit)", where, len, context);
  KvCache cache(cfg, context, kv);  // holds no storage until reserve()
  if (integer("vocab") != vocab) fail("{}: vocab {} does not match the model's {}", where, integer("vocab"), vocab);
  if (integer("row") != int64_t(cache.row_size()))
    fail("{}: row of {} values does not match the model's {}", where, integer("row"), cache.row_size());
  if (!h.contains("kv") || !h["kv"].is_string() || h["kv"].get<std::string>() != dtype_name(kv))
    fail("{}: KV rows of {} do not match this precision's {}", where, shorten(h.value("kv", nlohmann::json()).dump()),
         dtype_name(kv));
  const nlohmann::json& vis = h.contains("visible") ? h["visible"] : nlohmann::json();
  if (!vis.is_array() || vis.size() != size_t(cfg.num_layers))
    fail("{}: 'visible' must list {} layers", where, cfg.num_layers);
  uint64_t rows = 0;
  for (int l = 0; l < cfg.num_layers; ++l) {
    const nlohmann::json& v = vis[size_t(l)];
    if (!v.is_number_integer() || v.get<int64_t>() != int64_t(cache.visible(l, len)))
      fail("{}: layer {} holds {} positions, expected {}", where, l, shorten(v.dump()), cache.visible(l, len));
    rows += 2 * cache.visible(l, len);
  }
  // Every size is known now: the file must hold exactly that much before anything is allocated.
  const size_t row = cache.row_bytes();
  const uint64_t data = uint64_t(vocab) * sizeof(float) + rows * row;
  const uint64_t body = size - kFixed - n;
  if (body < data) fail("{}: truncated: {} data bytes, the header needs {}", where, body, data);
  if (body > data) fail("{}: {} trailing bytes", where, body - data);

  SavedPrefill s{std::move(cache), std::vector<float>(size_t(vocab))};
  uint64_t off = sizeof kMagic + 8 + n;
  uint64_t sum = checksum64(text.data(), text.size());
  auto get = [&](void* p, size_t bytes) {
    f.read_at(p, bytes, off);
    off += bytes;
    sum = checksum64(p, bytes, sum);
  };
  get(s.logits.data(), s.logits.size() * sizeof(float));
  s.cache.reserve(len);
  for (int l = 0; l < cfg.num_layers; ++l)
    for (std::byte* (KvCache::*slot)(int, int64_t) : {&KvCache::key_slot, &KvCache::value_slot})
      for (int64_t p = len - int64_t(s.cache.visible(l, len)); p < len; ++p) get((s.cache.*slot)(l, p), row);
  uint64_t saved_sum = 0;
  f.read_at(&saved_sum, sizeof saved_sum, off);
  if (saved_sum != sum) fail("{}: checksum mismatch: the file is corrupted", where);
  s.cache.advance(len);
  return s;
}

}  // namespace vlm
