// `vlm quantize`: a safetensors folder → a GGUF model file llama.cpp loads (and its mmproj
// file): the metadata, names and norm shift of docs/gguf.md §3–§5 (as tools/convert_hf_to_gguf.py
// writes them) and block-quantized matrices (kernels::quantize_row).
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "io/file.h"
#include "io/gguf_write.h"
#include "io/json.h"
#include "kernels/format.h"
#include "kernels/quant.h"
#include "models/gemma3/registry.h"

namespace vlm::cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The tokenizer.json vocabulary as SentencePiece-style keys (docs/gguf.md §4, writer side):
// ids in tokenizer.json order up to the embedding's rows, scores minus the rank of the first
// merge producing a piece, added tokens control / unknown / user-defined, <0xNN> byte pieces.
void add_tokenizer(GgufWriter& w, const fs::path& dir, size_t rows) {
  const fs::path tj = dir / "tokenizer.json", tc = dir / "tokenizer_config.json";
  const json tok = parse_json(read_text_file(tj, size_t(1) << 30), tj.string());
  const json cfg = fs::exists(tc) ? parse_json(read_text_file(tc), tc.string()) : json::object();
  const json& model = tok.at("model");
  if (model.value("type", "") != "BPE") fail("{}: model.type is not BPE", tj.string());
  std::map<std::string, int64_t> pieces;
  for (const auto& [text, id] : model.at("vocab").items()) pieces[text] = id.get<int64_t>();
  std::map<std::string, json> added;
  if (tok.contains("added_tokens"))
    for (const json& a : tok["added_tokens"]) {
      added[a.at("content").get<std::string>()] = a;
      pieces[a.at("content").get<std::string>()] = a.at("id").get<int64_t>();
    }
  const size_t n = rows;
  std::vector<std::string> tokens(n);
  std::vector<int32_t> types(n, 5);  // unused
  std::vector<float> scores(n, -1000.0f);
  for (size_t i = 0; i < n; ++i) tokens[i] = fmt::format("[PAD{}]", i);
  for (const auto& [text, id] : pieces)
    if (id >= 0 && size_t(id) < n) tokens[size_t(id)] = text, types[size_t(id)] = 1, scores[size_t(id)] = 0.0f;
  size_t rank = 0;
  for (const json& m : model.at("merges")) {
    ++rank;
    const std::string a = m.is_string() ? m.get<std::string>().substr(0, m.get<std::string>().find(' ')) : m[0].get<std::string>();
    const std::string b = m.is_string() ? m.get<std::string>().substr(m.get<std::string>().find(' ') + 1) : m[1].get<std::string>();
    auto it = pieces.find(a + b);
    if (it != pieces.end() && it->second >= 0 && size_t(it->second) < n && scores[size_t(it->second)] == 0.0f)
      scores[size_t(it->second)] = -float(rank);
  }
  for (size_t i = 0; i < n; ++i)
    if (tokens[i].size() == 6 && tokens[i].starts_with("<0x") && tokens[i].ends_with(">")) types[i] = 6;
  const std::string unk = model.value("unk_token", std::string());
  for (const auto& [text, a] : added) {
    const int64_t id = a.at("id").get<int64_t>();
    if (id >= 0 && size_t(id) < n) types[size_t(id)] = a.value("special", false) ? (text == unk ? 2 : 3) : 4;
  }
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_string("tokenizer.ggml.pre", "default");
  w.add_strings("tokenizer.ggml.tokens", tokens);
  w.add_f32s("tokenizer.ggml.scores", scores);
  w.add_i32s("tokenizer.ggml.token_type", types);
  auto special = [&](const char* key, const char* name) {
    if (!cfg.contains(name)) return;
    const json& v = cfg[name];
    const std::string text = v.is_object() ? v.value("content", "") : v.is_string() ? v.get<std::string>() : "";
    auto it = pieces.find(text);
    if (it != pieces.end() && it->second >= 0 && size_t(it->second) < n)
      w.add_u32(fmt::format("tokenizer.ggml.{}_token_id", key), uint32_t(it->second));
  };
  special("bos", "bos_token");
  special("eos", "eos_token");
  special("unknown", "unk_token");
  special("padding", "pad_token");
  w.add_bool("tokenizer.ggml.add_bos_token", cfg.value("add_bos_token", true));
  w.add_bool("tokenizer.ggml.add_eos_token", cfg.value("add_eos_token", false));
  w.add_bool("tokenizer.ggml.add_space_prefix", false);
  if (cfg.contains("chat_template") && cfg["chat_template"].is_string())
    w.add_string("tokenizer.chat_template", cfg["chat_template"].get<std::string>());
}

// llama.cpp's use_more_bits (src/llama-quant.cpp): the first and last eighth of the layers and
// every third in between get the larger type in the _M mixes.
bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// The stored type of a text tensor, as llama.cpp's llama_tensor_get_type decides for these
// mixes (without an importance matrix): the output head (token_embd when tied) Q6_K except for
// Q8_0 files; Q4_K_M and Q5_K_M: attn_v and ffn_down Q6_K on use_more_bits layers, else Q4_K or
// Q5_K; Q3_K_M: attn_v Q5_K in the first two layers, else Q4_K, ffn_down Q5_K in the first
// sixteenth, else Q4_K, attn_output Q4_K; Q3_K_L: those three Q5_K; Q2_K: ffn_down and
// attn_output Q3_K, attn_v Q3_K (Q4_K where four or more query heads share a KV head); IQ4_XS:
// ffn_down of the first eighth of the layers, and attn_v where four or more query heads share a
// KV head (Gemma 3 1B), Q5_K. Rows that are not whole blocks of the type fall back (add()).
GgmlType text_type(const std::string& type, const std::string& gguf_name, bool head, int layer, int n_layers,
                   int gqa) {
  const GgmlType base = type == "q8_0"              ? GgmlType::Q8_0
                        : type == "q4_0"            ? GgmlType::Q4_0
                        : type == "q4_1"            ? GgmlType::Q4_1
                        : type == "q2_k"            ? GgmlType::Q2_K
                        : type.starts_with("q3_k_") ? GgmlType::Q3_K
                        : type == "q5_k_m"          ? GgmlType::Q5_K
                        : type == "iq4_xs"          ? GgmlType::IQ4_XS
                                                    : GgmlType::Q4_K;
  const bool v = gguf_name.ends_with(".attn_v.weight"), down = gguf_name.ends_with(".ffn_down.weight");
  const bool o = gguf_name.ends_with(".attn_output.weight");
  if (head) return base == GgmlType::Q8_0 ? GgmlType::Q8_0 : GgmlType::Q6_K;
  if ((type == "q4_k_m" || type == "q5_k_m") && (v || down) && use_more_bits(layer, n_layers)) return GgmlType::Q6_K;
  if (type == "q3_k_m" && (v || down || o))
    return (v && layer < 2) || (down && layer < n_layers / 16) ? GgmlType::Q5_K : GgmlType::Q4_K;
  if (type == "q3_k_l" && (v || down || o)) return GgmlType::Q5_K;
  if (type == "q2_k" && (v || down || o)) return v && gqa >= 4 ? GgmlType::Q4_K : GgmlType::Q3_K;
  if (type == "iq4_xs" && ((down && layer < n_layers / 8) || (v && gqa >= 4))) return GgmlType::Q5_K;
  return base;
}

// llama.cpp's tensor_type_fallback (src/llama-quant.cpp): rows that are not whole 256-blocks
// (Gemma 3 1B's 1152 columns) take the 32-value type of about as many bits (IQ4_XS: IQ4_NL;
// Q2_K and Q3_K: Q4_0), and rows that are not whole 32-blocks either are stored f16 (vectors f32).
GgmlType fallback(GgmlType type, size_t cols, bool vector) {
  if (cols % size_t(ggml_traits(type).block_elems) == 0) return type;
  const GgmlType t32 = type == GgmlType::Q2_K || type == GgmlType::Q3_K ? GgmlType::Q4_0
                       : type == GgmlType::Q4_K   ? GgmlType::Q5_0
                       : type == GgmlType::Q5_K   ? GgmlType::Q5_1
                       : type == GgmlType::Q6_K   ? GgmlType::Q8_0
                       : type == GgmlType::IQ4_XS ? GgmlType::IQ4_NL
                                                  : type;
  if (cols % size_t(ggml_traits(t32).block_elems) == 0) return t32;
  return vector ? GgmlType::F32 : GgmlType::F16;
}

// Adds one tensor: values widened to f32 row by row, norms shifted to 1 + w, rows quantized.
void add(GgufWriter& w, const TensorView& t, const std::string& name, GgmlType type, bool shift) {
  const size_t cols = t.shape.empty() ? 1 : size_t(t.shape.back()), rows = size_t(t.numel()) / cols;
  type = fallback(type, cols, t.shape.size() == 1);
  const kernels::Format& src = kernels::format_of(t.dtype);
  const size_t out_row = size_t(ggml_traits(type).block_bytes) * cols / size_t(ggml_traits(type).block_elems);
  std::vector<std::byte> out(rows * out_row);
  std::vector<float> row(cols);
  for (size_t r = 0; r < rows; ++r) {
    src.to_f32(t.data + r * src.row_bytes(cols), row.data(), cols);
    if (shift)
      for (float& v : row) v = 1.0f + v;  // Gemma3RMSNorm's (1 + w), in f32 (docs/gguf.md §3)
    kernels::quantize_row(type, row.data(), out.data() + r * out_row, cols);
  }
  w.add_tensor(name, t.shape, type, std::move(out));
}

int layer_of(const std::string& canonical) {
  const std::string p = "text.layers.";
  return canonical.starts_with(p) ? std::stoi(canonical.substr(p.size())) : -1;
}

void write_text(const Checkpoint& ck, const fs::path& out, const std::string& type) {
  const ModelConfig& c = ck.config();
  const TextConfig& t = c.text;
  GgufWriter w;
  w.add_string("general.architecture", "gemma3");
  w.add_string("general.type", "model");
  w.add_string("general.name", ck.dir().filename().string());
  const std::map<std::string, uint32_t> ftype = {
      {"q8_0", 7},    {"q4_0", 2},    {"q4_1", 3},    {"q2_k", 10},   {"q3_k_s", 11},
      {"q3_k_m", 12}, {"q3_k_l", 13}, {"q4_k_m", 15}, {"q5_k_m", 17}, {"iq4_xs", 30}};
  w.add_u32("general.file_type", ftype.at(type));  // llama_ftype
  w.add_u32("general.quantization_version", 2);
  w.add_u32("gemma3.context_length", uint32_t(t.max_position_embeddings));
  w.add_u32("gemma3.embedding_length", uint32_t(t.hidden_size));
  w.add_u32("gemma3.block_count", uint32_t(t.num_layers));
  w.add_u32("gemma3.feed_forward_length", uint32_t(t.intermediate_size));
  w.add_u32("gemma3.attention.head_count", uint32_t(t.num_heads));
  w.add_u32("gemma3.attention.head_count_kv", uint32_t(t.num_kv_heads));
  w.add_u32("gemma3.attention.key_length", uint32_t(t.head_dim));
  w.add_u32("gemma3.attention.value_length", uint32_t(t.head_dim));
  w.add_f32("gemma3.attention.layer_norm_rms_epsilon", float(t.rms_norm_eps));
  w.add_f32("gemma3.rope.freq_base", float(t.rope_theta));
  w.add_u32("gemma3.attention.sliding_window", uint32_t(t.sliding_window));
  if (t.rope_scaling_type == "linear") {
    w.add_string("gemma3.rope.scaling.type", "linear");
    w.add_f32("gemma3.rope.scaling.factor", float(t.rope_scaling_factor));
  }
  const TensorView& embed = ck.get("text.embed_tokens.weight");
  add_tokenizer(w, ck.dir(), size_t(embed.dim(0)));
  const bool tied = !ck.find("lm_head.weight");
  for (const TensorSpec& spec : models::gemma3::tensor_registry(c)) {
    if (part_of(spec.name) != "text" || !ck.find(spec.name)) continue;
    const std::string name = gguf_name_of(spec.name).value_or("output.weight");
    const TensorView& v = ck.get(spec.name);
    const bool head = spec.name == "lm_head.weight" || (tied && spec.name == "text.embed_tokens.weight");
    const GgmlType g = v.shape.size() == 1 ? GgmlType::F32
                                           : text_type(type, name, head, layer_of(spec.name), t.num_layers,
                                                       t.num_heads / t.num_kv_heads);
    add(w, v, name, g, spec.name.ends_with("norm.weight"));
  }
  w.write(out);
}

void write_mmproj(const Checkpoint& ck, const fs::path& out, GgmlType type) {
  const ModelConfig& c = ck.config();
  const VisionConfig& v = *c.vision;
  const PreprocessorConfig pp = effective_preprocessor(c);
  GgufWriter w;
  w.add_string("general.architecture", "clip");
  w.add_string("general.type", "mmproj");
  w.add_u32("general.file_type", type == GgmlType::F32 ? 0 : type == GgmlType::BF16 ? 32 : type == GgmlType::Q8_0 ? 7 : 1);
  w.add_bool("clip.has_vision_encoder", true);
  w.add_string("clip.projector_type", "gemma3");
  w.add_u32("clip.vision.projection_dim", uint32_t(c.text.hidden_size));
  w.add_u32("clip.vision.image_size", uint32_t(v.image_size));
  w.add_u32("clip.vision.patch_size", uint32_t(v.patch_size));
  w.add_u32("clip.vision.embedding_length", uint32_t(v.hidden_size));
  w.add_u32("clip.vision.feed_forward_length", uint32_t(v.intermediate_size));
  w.add_u32("clip.vision.block_count", uint32_t(v.num_layers));
  w.add_u32("clip.vision.attention.head_count", uint32_t(v.num_heads));
  w.add_f32("clip.vision.attention.layer_norm_epsilon", float(v.layer_norm_eps));
  w.add_f32s("clip.vision.image_mean", {pp.image_mean[0], pp.image_mean[1], pp.image_mean[2]});
  w.add_f32s("clip.vision.image_std", {pp.image_std[0], pp.image_std[1], pp.image_std[2]});
  w.add_bool("clip.use_gelu", true);
  if (c.pool_kernel() != 4) w.add_u32("clip.vision.projector.scale_factor", uint32_t(c.pool_kernel()));
  for (const TensorSpec& spec : models::gemma3::tensor_registry(c)) {
    if (part_of(spec.name) == "text") continue;
    const TensorView& t = ck.get(spec.name);
    const std::string name = *gguf_name_of(spec.name);
    // clip.cpp / llama.cpp's converter: embeddings f32, the projection f16, vectors f32.
    const GgmlType g = spec.name.find(".embeddings.") != std::string::npos || t.shape.size() == 1 ? GgmlType::F32
                       : name == "mm.input_projection.weight"                                   ? GgmlType::F16
                                                                                                : type;
    add(w, t, name, g, spec.name == "projector.mm_soft_emb_norm.weight");
  }
  w.write(out);
}

}  // namespace

int cmd_quantize(int argc, char** argv) {
  CLI::App app{"Write a safetensors checkpoint as a block-quantized GGUF file (and its mmproj file)", argv[0]};
  std::string model, type, out, mmproj_out, mmproj_type = "f16";
  app.add_option("--model", model, "checkpoint folder (safetensors)")->required();
  app.add_option("--type", type,
                 "q8_0, q4_0, q4_1, q2_k, q3_k_s, q3_k_m, q3_k_l, q4_k_m, q5_k_m or iq4_xs (with the larger "
                 "types where llama.cpp's mix puts them)")
      ->required()
      ->check(CLI::IsMember({"q8_0", "q4_0", "q4_1", "q2_k", "q3_k_s", "q3_k_m", "q3_k_l", "q4_k_m", "q5_k_m", "iq4_xs"}));
  app.add_option("--out", out, "the model .gguf to write")->required();
  app.add_option("--mmproj-out", mmproj_out, "also write the vision tower + projector as an mmproj .gguf");
  app.add_option("--mmproj-type", mmproj_type, "mmproj matrices: f16, bf16, f32 or q8_0")
      ->check(CLI::IsMember({"f16", "bf16", "f32", "q8_0"}));
  CLI11_PARSE(app, argc, argv);
  if (!fs::exists(fs::path(model) / "config.json")) fail("--model {}: not a safetensors folder (no config.json)", model);
  const Checkpoint ck = models::gemma3::open_checkpoint(model, Parts{true, !mmproj_out.empty()});
  if (!mmproj_out.empty() && !ck.config().is_vlm())
    fail("--mmproj-out: {} is a text-only checkpoint ({})", model, ck.config().architecture);
  const TextConfig& t = ck.config().text;
  for (int i = 0; i < t.num_layers; ++i)
    if ((t.layer_kinds[size_t(i)] == LayerKind::Sliding) != (i % 6 < 5) || t.query_pre_attn_scalar != t.head_dim) {
      std::fprintf(stderr, "warning: %s's layer pattern or attention scale is not llama.cpp's fixed Gemma 3 rule "
                   "(docs/gguf.md §3); the file holds the weights, readers compute their model\n", model.c_str());
      break;
    }
  write_text(ck, out, type);
  if (!mmproj_out.empty())
    write_mmproj(ck, mmproj_out, *ggml_type_from_name(mmproj_type));
  std::fprintf(stderr, "wrote %s%s%s\n", out.c_str(), mmproj_out.empty() ? "" : " and ", mmproj_out.c_str());
  return 0;
}

}  // namespace vlm::cli
