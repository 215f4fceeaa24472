// Test helpers that write small safetensors files and model folders from
// scratch, so loader tests control every byte (hostile cases included).
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "io/checkpoint.h"

namespace vlm::test {

namespace fs = std::filesystem;
using nlohmann::json;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "vlm-test-XXXXXX").string();
    path = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path operator/(const std::string& name) const { return path / name; }
};

inline std::span<const std::byte> bytes_of(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// The error message of `parse(bytes, name)` on `file` (empty if it parsed).
template <class Parse>
std::string parse_error(Parse parse, const std::string& file, const char* name) {
  try {
    parse(bytes_of(file), name);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Expects a one-line refusal that names the file and contains every fragment.
template <class Parse>
void expect_refused(Parse parse, const std::string& file, const char* name,
                    std::initializer_list<const char*> fragments) {
  const std::string msg = parse_error(parse, file, name);
  ASSERT_FALSE(msg.empty()) << "accepted a hostile file";
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_NE(msg.find(name), std::string::npos) << msg;
  for (const char* f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "missing '" << f << "' in: " << msg;
}

inline void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

inline std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[size_t(i)] = char((n >> (8 * i)) & 0xff);
  return s;
}

// A file from a literal header and data section (no checks: for hostile cases).
inline std::string raw_safetensors(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}

struct Spec {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
};

// Element i of tensor number k: distinct, exactly representable in every dtype.
inline float pattern_value(size_t k, int64_t i) { return float(int((k * 7 + size_t(i)) % 61) - 30) / 16.0f; }

// A well-formed file: header padded to 8 bytes, tensors back to back in order. Tensor k's
// values are pattern_value(ids[k], ·) (ids empty: k), so a model's values do not depend on
// how it is sharded.
inline std::string make_safetensors(const std::vector<Spec>& specs, const std::vector<size_t>& ids = {}) {
  json h = json::object();
  std::string data;
  for (size_t k = 0; k < specs.size(); ++k) {
    const Spec& s = specs[k];
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    const size_t begin = data.size();
    for (int64_t i = 0; i < n; ++i) {
      const float v = pattern_value(ids.empty() ? k : ids[k], i);
      if (s.dtype == DType::F32) {
        data.append(reinterpret_cast<const char*>(&v), 4);
      } else {
        const uint16_t b = s.dtype == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
        data.append(reinterpret_cast<const char*>(&b), 2);
      }
    }
    h[s.name] = {{"dtype", std::string(dtype_name(s.dtype))}, {"shape", s.shape}, {"data_offsets", {begin, data.size()}}};
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  return raw_safetensors(header, data);
}

// A small VLM config: 3 text layers (pattern 3: layer 2 global), 2x2 pooled tokens.
inline json small_vlm_config() {
  return json::parse(R"({
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
    "boi_token_index": 255, "eoi_token_index": 256, "image_token_index": 257,
    "eos_token_id": [1, 106], "mm_tokens_per_image": 4, "torch_dtype": "float32",
    "text_config": {"model_type": "gemma3_text", "vocab_size": 300, "hidden_size": 16,
      "intermediate_size": 32, "num_hidden_layers": 3, "num_attention_heads": 2,
      "num_key_value_heads": 1, "head_dim": 8, "query_pre_attn_scalar": 8,
      "sliding_window": 4, "sliding_window_pattern": 3,
      "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 8,
      "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
      "image_size": 16, "patch_size": 4, "vision_use_head": false}
  })");
}

inline json small_text_config() {
  return json::parse(R"({
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
    "vocab_size": 300, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 3,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
    "query_pre_attn_scalar": 8, "sliding_window": 4, "eos_token_id": [1, 106],
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]
  })");
}

// All tensors a config implies, in file names of `naming` (written independently
// of the loader's own table, from docs/gemma3/checkpoint.md).
inline std::vector<Spec> model_tensors(const json& cfg, Naming naming, DType dt, bool explicit_head = false) {
  const bool vlm = cfg.contains("text_config");
  const json& t = vlm ? cfg["text_config"] : cfg;
  const int64_t V = t["vocab_size"], H = t["hidden_size"], I = t["intermediate_size"], L = t["num_hidden_layers"];
  const int64_t d = t["head_dim"], q = d * t["num_attention_heads"].get<int64_t>(),
                kv = d * t["num_key_value_heads"].get<int64_t>();
  const std::string tp = naming == Naming::Old   ? "language_model.model."
                         : naming == Naming::New ? "model.language_model."
                                                 : "model.";
  std::vector<Spec> s;
  s.push_back({tp + "embed_tokens.weight", dt, {V, H}});
  s.push_back({tp + "norm.weight", dt, {H}});
  for (int64_t n = 0; n < L; ++n) {
    const std::string p = tp + "layers." + std::to_string(n) + ".";
    for (const char* nm : {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                           "post_feedforward_layernorm"})
      s.push_back({p + nm + ".weight", dt, {H}});
    s.push_back({p + "self_attn.q_proj.weight", dt, {q, H}});
    s.push_back({p + "self_attn.k_proj.weight", dt, {kv, H}});
    s.push_back({p + "self_attn.v_proj.weight", dt, {kv, H}});
    s.push_back({p + "self_attn.o_proj.weight", dt, {H, q}});
    s.push_back({p + "self_attn.q_norm.weight", dt, {d}});
    s.push_back({p + "self_attn.k_norm.weight", dt, {d}});
    s.push_back({p + "mlp.gate_proj.weight", dt, {I, H}});
    s.push_back({p + "mlp.up_proj.weight", dt, {I, H}});
    s.push_back({p + "mlp.down_proj.weight", dt, {H, I}});
  }
  if (explicit_head) s.push_back({naming == Naming::Old ? "language_model.lm_head.weight" : "lm_head.weight", dt, {V, H}});
  if (!vlm) return s;
  const json& v = cfg["vision_config"];
  const int64_t Hv = v["hidden_size"], Iv = v["intermediate_size"], P = v["patch_size"];
  const int64_t side = v["image_size"].get<int64_t>() / P;
  const std::string vp = naming == Naming::Old ? "vision_tower.vision_model." : "model.vision_tower.vision_model.";
  s.push_back({vp + "embeddings.patch_embedding.weight", dt, {Hv, 3, P, P}});
  s.push_back({vp + "embeddings.patch_embedding.bias", dt, {Hv}});
  s.push_back({vp + "embeddings.position_embedding.weight", dt, {side * side, Hv}});
  s.push_back({vp + "post_layernorm.weight", dt, {Hv}});
  s.push_back({vp + "post_layernorm.bias", dt, {Hv}});
  for (int64_t n = 0; n < v["num_hidden_layers"].get<int64_t>(); ++n) {
    const std::string p = vp + "encoder.layers." + std::to_string(n) + ".";
    for (const char* nm : {"layer_norm1", "layer_norm2"}) {
      s.push_back({p + nm + ".weight", dt, {Hv}});
      s.push_back({p + nm + ".bias", dt, {Hv}});
    }
    for (const char* nm : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
      s.push_back({p + "self_attn." + nm + ".weight", dt, {Hv, Hv}});
      s.push_back({p + "self_attn." + nm + ".bias", dt, {Hv}});
    }
    s.push_back({p + "mlp.fc1.weight", dt, {Iv, Hv}});
    s.push_back({p + "mlp.fc1.bias", dt, {Iv}});
    s.push_back({p + "mlp.fc2.weight", dt, {Hv, Iv}});
    s.push_back({p + "mlp.fc2.bias", dt, {Hv}});
  }
  const std::string pp = naming == Naming::Old ? "multi_modal_projector." : "model.multi_modal_projector.";
  s.push_back({pp + "mm_input_projection_weight", dt, {Hv, H}});
  s.push_back({pp + "mm_soft_emb_norm.weight", dt, {Hv}});
  return s;
}

// Writes config.json and the weights: one file, or `shards` files plus index.json
// (tensors dealt round-robin).
inline void write_model(const fs::path& dir, const json& cfg, const std::vector<Spec>& tensors, int shards = 1) {
  fs::create_directories(dir);
  write_file(dir / "config.json", cfg.dump(2));
  if (shards == 1) {
    write_file(dir / "model.safetensors", make_safetensors(tensors));
    return;
  }
  std::vector<std::vector<Spec>> parts(static_cast<size_t>(shards));
  std::vector<std::vector<size_t>> ids(static_cast<size_t>(shards));
  json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
  for (size_t i = 0; i < tensors.size(); ++i) {
    const size_t k = i % size_t(shards);
    parts[k].push_back(tensors[i]);
    ids[k].push_back(i);
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05d.safetensors", k + 1, shards);
    index["weight_map"][tensors[i].name] = name;
  }
  for (size_t k = 0; k < parts.size(); ++k) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05d.safetensors", k + 1, shards);
    write_file(dir / name, make_safetensors(parts[k], ids[k]));
  }
  write_file(dir / "model.safetensors.index.json", index.dump(2));
}

}  // namespace vlm::test
