#include "io/identity.h"

#include <cmath>
#include <cstring>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json.h"

namespace vlm {

uint64_t fnv1a64(const void* data, size_t n, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t checksum64(const void* data, size_t n, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x9e3779b97f4a7c15ull;  // multiply, then fold the high bits back down
    h ^= h >> 29;
  }
  for (; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

uint64_t Identity::hash() const {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const auto& [k, v] : fields) {
    const std::string line = k + "=" + v + "\n";
    h = fnv1a64(line.data(), line.size(), h);
  }
  return h;
}

std::string Identity::hash_hex() const { return fmt::format("{:016x}", hash()); }

std::string default_mask_mode(const ModelConfig& c) { return c.is_vlm() ? "hf" : "causal"; }

std::string default_scaling_policy(DType embedding_dtype) {
  return embedding_dtype == DType::BF16 ? "bf16-normalizer" : "f32-normalizer";
}

std::string default_precision(DType matrix_dtype) {
  return matrix_dtype == DType::F32 || matrix_dtype == DType::F16 ? "f32" : "bf16";
}

void add_precision(Identity& id, std::string_view precision) {
  auto it = id.fields.begin();
  while (it != id.fields.end() && it->first != "scaling_policy") ++it;
  id.fields.emplace(it == id.fields.end() ? it : it + 1, "precision", std::string(precision));
}

Identity make_identity(const ModelConfig& c, const std::string& weight_dtypes, std::string_view mask_mode,
                       std::string_view scaling_policy, std::string_view weights) {
  Identity id;
  auto add = [&](std::string k, std::string v) { id.fields.emplace_back(std::move(k), std::move(v)); };
  // Doubles print in shortest round-trip form, so equal values hash equally.
  auto num = [](double x) { return fmt::format("{}", x); };
  const TextConfig& t = c.text;

  add("layout_version", std::to_string(kIdentityLayoutVersion));
  add("architecture", c.architecture);
  add("mask_mode", std::string(mask_mode));
  add("scaling_policy", std::string(scaling_policy));
  add("weight_dtypes", weight_dtypes);
  add("weights", std::string(weights));

  add("text.vocab_size", std::to_string(t.vocab_size));
  add("text.hidden_size", std::to_string(t.hidden_size));
  add("text.intermediate_size", std::to_string(t.intermediate_size));
  add("text.num_layers", std::to_string(t.num_layers));
  add("text.num_heads", std::to_string(t.num_heads));
  add("text.num_kv_heads", std::to_string(t.num_kv_heads));
  add("text.head_dim", std::to_string(t.head_dim));
  add("text.query_pre_attn_scalar", num(t.query_pre_attn_scalar));
  add("text.rms_norm_eps", num(t.rms_norm_eps));
  add("text.hidden_activation", t.hidden_activation);
  add("text.sliding_window", std::to_string(t.sliding_window));
  std::string kinds;
  for (LayerKind k : t.layer_kinds) kinds += k == LayerKind::Sliding ? 'S' : 'G';
  add("text.layer_kinds", kinds);
  add("text.rope_theta", num(t.rope_theta));
  add("text.rope_local_base_freq", num(t.rope_local_base_freq));
  add("text.rope_scaling_type", t.rope_scaling_type);
  add("text.rope_scaling_factor", num(t.rope_scaling_factor));
  add("text.tie_word_embeddings", t.tie_word_embeddings ? "true" : "false");

  // Text models still list these fields, as "none", so a diff against a VLM names them.
  const bool vlm = c.vision.has_value();
  auto opt = [&](auto f) { return vlm ? f() : std::string("none"); };
  add("boi_token_id", opt([&] { return std::to_string(c.boi_token_id); }));
  add("eoi_token_id", opt([&] { return std::to_string(c.eoi_token_id); }));
  add("image_token_id", opt([&] { return std::to_string(c.image_token_id); }));
  add("mm_tokens_per_image", opt([&] { return std::to_string(c.mm_tokens_per_image); }));
  add("vision.image_size", opt([&] { return std::to_string(c.vision->image_size); }));
  add("vision.patch_size", opt([&] { return std::to_string(c.vision->patch_size); }));
  add("vision.num_channels", opt([&] { return std::to_string(c.vision->num_channels); }));
  add("vision.hidden_size", opt([&] { return std::to_string(c.vision->hidden_size); }));
  add("vision.intermediate_size", opt([&] { return std::to_string(c.vision->intermediate_size); }));
  add("vision.num_layers", opt([&] { return std::to_string(c.vision->num_layers); }));
  add("vision.num_heads", opt([&] { return std::to_string(c.vision->num_heads); }));
  add("vision.layer_norm_eps", opt([&] { return num(c.vision->layer_norm_eps); }));
  add("vision.hidden_act", opt([&] { return c.vision->hidden_act; }));
  add("projector.pool_kernel", opt([&] { return std::to_string(c.pool_kernel()); }));
  add("projector.shape", opt([&] { return fmt::format("{}x{}", c.vision->hidden_size, t.hidden_size); }));
  // The processor turns pixels into the tower's input: each of its values changes the numbers.
  const std::optional<PreprocessorConfig> pp = vlm ? std::optional(effective_preprocessor(c)) : std::nullopt;
  auto pre = [&](auto f) { return pp ? f(*pp) : std::string("none"); };
  auto flag = [](bool b) { return std::string(b ? "true" : "false"); };
  auto three = [](const float* v) { return fmt::format("{},{},{}", v[0], v[1], v[2]); };
  using P = const PreprocessorConfig&;
  add("preprocessor.size", pre([](P p) { return fmt::format("{}x{}", p.height, p.width); }));
  add("preprocessor.resample", pre([](P p) { return std::to_string(p.resample); }));
  add("preprocessor.do_resize", pre([&](P p) { return flag(p.do_resize); }));
  add("preprocessor.do_rescale", pre([&](P p) { return flag(p.do_rescale); }));
  add("preprocessor.rescale_factor", pre([&](P p) { return num(p.rescale_factor); }));
  add("preprocessor.do_normalize", pre([&](P p) { return flag(p.do_normalize); }));
  add("preprocessor.image_mean", pre([&](P p) { return three(p.image_mean); }));
  add("preprocessor.image_std", pre([&](P p) { return three(p.image_std); }));
  add("preprocessor.do_convert_rgb", pre([&](P p) { return flag(p.do_convert_rgb); }));
  add("preprocessor.do_pan_and_scan", pre([&](P p) { return flag(p.do_pan_and_scan); }));
  add("preprocessor.pan_and_scan_min_crop_size", pre([](P p) { return std::to_string(p.pan_and_scan_min_crop_size); }));
  add("preprocessor.pan_and_scan_max_num_crops", pre([](P p) { return std::to_string(p.pan_and_scan_max_num_crops); }));
  add("preprocessor.pan_and_scan_min_ratio_to_activate",
      pre([&](P p) { return num(p.pan_and_scan_min_ratio_to_activate); }));
  return id;
}

Identity make_identity(const Checkpoint& ck, std::string_view mask_mode, std::string_view scaling_policy) {
  return make_identity(ck.config(), ck.weight_dtypes(), mask_mode, scaling_policy, ck.weights_fingerprint());
}

std::vector<std::string> identity_diff(const Identity& a, const Identity& b) {
  std::map<std::string, std::string> bm(b.fields.begin(), b.fields.end());
  std::vector<std::string> out;
  for (const auto& [k, v] : a.fields) {
    auto it = bm.find(k);
    if (it == bm.end() || it->second != v) out.push_back(k);
    if (it != bm.end()) bm.erase(it);
  }
  for (const auto& [k, v] : b.fields)
    if (bm.count(k)) out.push_back(k);
  return out;
}

nlohmann::json identity_to_json(const Identity& id) {
  nlohmann::json f = nlohmann::json::object();
  for (const auto& [k, v] : id.fields) f[k] = v;
  return {{"hash", id.hash_hex()}, {"fields", f}};
}

Identity identity_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("fields") || !j["fields"].is_object())
    fail("{}: no identity \"fields\" object", where);
  Identity id;
  for (const auto& [k, v] : j["fields"].items()) {
    if (!v.is_string()) fail("{}: identity field {} is not a string", where, shorten(k));
    id.fields.emplace_back(k, v.get<std::string>());
  }
  return id;
}

void require_same_identity(const Identity& saved, const Identity& ours, const std::string& where) {
  const std::vector<std::string> diff = identity_diff(saved, ours);
  if (diff.empty()) return;
  auto value = [](const Identity& id, const std::string& k) {
    for (const auto& [n, v] : id.fields)
      if (n == k) return v;
    return std::string("(absent)");
  };
  std::string list;
  for (const std::string& k : diff)
    list += fmt::format("{}{} ({} vs {})", list.empty() ? "" : ", ", shorten(k), shorten(value(saved, k)),
                        shorten(value(ours, k)));
  fail("{} was made for another model identity; differing fields (saved vs now): {}", where, list);
}

}  // namespace vlm
