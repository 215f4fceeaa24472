// config.json / preprocessor_config.json for Gemma 3.
//
// Defaults: where a key is absent (or null) the HF class default is used, as HF
// itself does (docs/gemma3/config.md: Gemma3TextConfig, SiglipVisionConfig,
// Gemma3Config; docs/gemma3/preprocessing.md#config: processor). Google's 4B text_config relies on this for the
// head counts, head_dim, query_pre_attn_scalar and vocab_size.
// Exceptions, required with no default: the sizes that every published config
// states (text hidden_size, intermediate_size, num_hidden_layers; all vision
// sizes). A default there would silently describe a different model than the
// one whose weights sit next to the file.
//
// Refused rather than implemented: attention/final logit softcapping (null in
// every Gemma 3 release, docs/gemma3/decoder.md#head), use_bidirectional_attention (EmbeddingGemma),
// attention_bias, activations other than gelu_pytorch_tanh, RoPE types other than
// default/linear, scaled RoPE on sliding layers.
#include "io/config.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "io/file.h"
#include "io/json.h"

namespace vlm {

using nlohmann::json;

namespace {

using namespace config_limits;

// Typed access to one JSON object; errors read `<file>: <prefix><key>: <what>`.
class Fields {
 public:
  Fields(const json& obj, std::string where, std::string prefix)
      : obj_(obj), where_(std::move(where)), prefix_(std::move(prefix)) {}

  // Present and not null.
  bool has(const char* key) const { return obj_.contains(key) && !obj_[key].is_null(); }
  const json& at(const char* key) const { return obj_[key]; }

  [[noreturn]] void bad(std::string_view key, std::string_view what) const {
    fail("{}: {}{}: {}", where_, prefix_, key, what);
  }
  Fields sub(const char* key) const {
    if (!has(key) || !at(key).is_object()) bad(key, has(key) ? "must be an object" : "missing required field");
    return Fields(at(key), where_, prefix_ + key + ".");
  }

  int64_t integer(const char* key, std::optional<int64_t> def, int64_t lo, int64_t hi) const {
    if (!has(key)) {
      if (!def) bad(key, "missing required field");
      return *def;
    }
    const json& v = at(key);
    int64_t x;
    if (v.is_number_unsigned()) {
      if (v.get<uint64_t>() > uint64_t(hi)) bad(key, fmt::format("must be <= {}", hi));
      x = int64_t(v.get<uint64_t>());
    } else if (v.is_number_integer()) {
      x = v.get<int64_t>();
    } else if (v.is_number_float() && std::nearbyint(v.get<double>()) == v.get<double>() &&
               std::fabs(v.get<double>()) < 9e15) {
      x = int64_t(v.get<double>());  // 8.0 written by some serializers
    } else {
      bad(key, fmt::format("must be an integer, got {}", v.dump()));
    }
    if (x < lo) bad(key, lo == 1 ? std::string("must be > 0") : fmt::format("must be >= {}", lo));
    if (x > hi) bad(key, fmt::format("must be <= {}", hi));
    return x;
  }
  int dim(const char* key, std::optional<int64_t> def, int64_t hi = kMaxDim) const {
    return int(integer(key, def, 1, hi));
  }
  // A finite number in (lo, hi]: bounds far outside any real model, so that absurd
  // values (1e300, 1e-45) are refused instead of turning every logit into NaN or 0.
  double positive(const char* key, std::optional<double> def, double hi = kMaxScalar, double lo = 0) const {
    if (!has(key)) {
      if (!def) bad(key, "missing required field");
      return *def;
    }
    const json& v = at(key);
    if (!v.is_number()) bad(key, fmt::format("must be a number, got {}", v.dump()));
    const double x = v.get<double>();
    if (!(x > 0)) bad(key, fmt::format("must be > 0, got {}", v.dump()));
    if (!std::isfinite(x) || x <= lo || x > hi) bad(key, fmt::format("must be in ({}, {}], got {}", lo, hi, v.dump()));
    return x;
  }
  bool boolean(const char* key, bool def) const {
    if (!has(key)) return def;
    if (!at(key).is_boolean()) bad(key, fmt::format("must be true or false, got {}", at(key).dump()));
    return at(key).get<bool>();
  }
  std::string string(const char* key, const std::string& def) const {
    if (!has(key)) return def;
    if (!at(key).is_string()) bad(key, fmt::format("must be a string, got {}", at(key).dump()));
    return at(key).get<std::string>();
  }

 private:
  const json& obj_;
  std::string where_;
  std::string prefix_;
};

// {"rope_type"|"type": "default"|"linear", "factor": f} (legacy rope_scaling or one
// rope_parameters entry) -> (type, factor).
std::pair<std::string, double> parse_rope_kind(const Fields& f) {
  std::string type = f.has("rope_type") ? f.string("rope_type", "") : f.string("type", "default");
  if (type == "default") return {type, 1.0};
  if (type == "linear") return {type, f.positive("factor", std::nullopt, 1e6, 1e-6)};
  f.bad(f.has("rope_type") ? "rope_type" : "type",
        fmt::format("unsupported RoPE type '{}' (supported: default, linear)", printable(type)));
}

void parse_rope(const Fields& f, TextConfig& t) {
  if (f.has("rope_parameters")) {
    const Fields rp = f.sub("rope_parameters");
    const bool per_type = rp.has("full_attention") || rp.has("sliding_attention");
    // Newer HF folds rope_theta / rope_local_base_freq / rope_scaling into this dict,
    // keyed by layer type (docs/gemma3/config.md#layer-kinds); a flat dict describes the global layers.
    const Fields full = per_type ? rp.sub("full_attention") : rp;
    t.rope_theta = full.positive("rope_theta", f.positive("rope_theta", 1e6, kMaxScalar, 1), kMaxScalar, 1);
    std::tie(t.rope_scaling_type, t.rope_scaling_factor) = parse_rope_kind(full);
    t.rope_local_base_freq = f.positive("rope_local_base_freq", 1e4, kMaxScalar, 1);
    if (per_type) {
      const Fields sliding = rp.sub("sliding_attention");
      t.rope_local_base_freq = sliding.positive("rope_theta", t.rope_local_base_freq, kMaxScalar, 1);
      if (parse_rope_kind(sliding).first != "default")
        sliding.bad("rope_type", "sliding layers must use unscaled RoPE (docs/gemma3/config.md#layer-kinds)");
    }
    return;
  }
  // RoPE bases below 1 make inverse frequencies past f32's range.
  t.rope_theta = f.positive("rope_theta", 1e6, kMaxScalar, 1);
  t.rope_local_base_freq = f.positive("rope_local_base_freq", 1e4, kMaxScalar, 1);
  if (f.has("rope_scaling")) std::tie(t.rope_scaling_type, t.rope_scaling_factor) = parse_rope_kind(f.sub("rope_scaling"));
}

// docs/gemma3/config.md#layer-kinds: layer_types is authoritative; else the (legacy) sliding window pattern.
void parse_layer_kinds(const Fields& f, TextConfig& t) {
  t.layer_kinds.clear();
  if (f.has("layer_types")) {
    const json& lt = f.at("layer_types");
    if (!lt.is_array()) f.bad("layer_types", "must be a list");
    if (lt.size() != size_t(t.num_layers))
      f.bad("layer_types", fmt::format("has {} entries but num_hidden_layers is {}", lt.size(), t.num_layers));
    for (size_t i = 0; i < lt.size(); ++i) {
      const std::string s = lt[i].is_string() ? lt[i].get<std::string>() : lt[i].dump();
      if (s == "sliding_attention")
        t.layer_kinds.push_back(LayerKind::Sliding);
      else if (s == "full_attention")
        t.layer_kinds.push_back(LayerKind::Global);
      else
        f.bad(fmt::format("layer_types[{}]", i),
              fmt::format("unknown layer type '{}' (expected sliding_attention or full_attention)", printable(s)));
    }
    return;
  }
  const char* key = f.has("sliding_window_pattern") ? "sliding_window_pattern" : "_sliding_window_pattern";
  const int p = int(f.integer(key, 6, 1, kMaxLayers));
  for (int i = 0; i < t.num_layers; ++i) t.layer_kinds.push_back((i + 1) % p ? LayerKind::Sliding : LayerKind::Global);
}

TextConfig parse_text(const Fields& f) {
  TextConfig t;
  t.hidden_size = f.dim("hidden_size", std::nullopt);
  t.intermediate_size = f.dim("intermediate_size", std::nullopt);
  t.num_layers = f.dim("num_hidden_layers", std::nullopt, kMaxLayers);
  t.vocab_size = f.dim("vocab_size", 262208);
  t.num_heads = f.dim("num_attention_heads", 8, kMaxHeads);
  t.num_kv_heads = f.dim("num_key_value_heads", 4, kMaxHeads);
  t.head_dim = f.dim("head_dim", 256, kMaxHeadDim);
  t.query_pre_attn_scalar = f.positive("query_pre_attn_scalar", 256, 1e9, 1e-9);
  t.rms_norm_eps = f.positive("rms_norm_eps", 1e-6, kMaxEps);
  t.max_position_embeddings = f.dim("max_position_embeddings", 131072, kMaxPositions);
  t.sliding_window = f.dim("sliding_window", 4096, kMaxPositions);
  t.tie_word_embeddings = f.boolean("tie_word_embeddings", true);
  t.hidden_activation = f.string("hidden_activation", "gelu_pytorch_tanh");

  if (t.num_heads % t.num_kv_heads != 0)
    f.bad("num_attention_heads", fmt::format("{} is not a multiple of num_key_value_heads {}", t.num_heads,
                                             t.num_kv_heads));
  if (t.head_dim % 2 != 0) f.bad("head_dim", "must be even (RoPE rotates pairs)");
  if (t.hidden_activation != "gelu_pytorch_tanh")
    f.bad("hidden_activation", fmt::format("unsupported '{}' (supported: gelu_pytorch_tanh)", printable(t.hidden_activation)));
  if (f.boolean("use_bidirectional_attention", false))
    f.bad("use_bidirectional_attention", "true is not supported (EmbeddingGemma; docs/gemma3/config.md#text-config)");
  if (f.boolean("attention_bias", false)) f.bad("attention_bias", "true is not supported (Gemma 3 has no biases)");
  for (const char* cap : {"attn_logit_softcapping", "final_logit_softcapping"})
    if (f.has(cap)) f.bad(cap, "softcapping is not supported (null for every Gemma 3 model)");

  parse_layer_kinds(f, t);
  parse_rope(f, t);
  return t;
}

VisionConfig parse_vision(const Fields& f, int tokens_per_side) {
  VisionConfig v;
  v.hidden_size = f.dim("hidden_size", std::nullopt);
  v.intermediate_size = f.dim("intermediate_size", std::nullopt);
  v.num_layers = f.dim("num_hidden_layers", std::nullopt, kMaxLayers);
  v.num_heads = f.dim("num_attention_heads", std::nullopt, kMaxHeads);
  v.image_size = f.dim("image_size", std::nullopt, kMaxSide);
  v.patch_size = f.dim("patch_size", std::nullopt, kMaxSide);
  v.num_channels = f.dim("num_channels", 3);
  v.layer_norm_eps = f.positive("layer_norm_eps", 1e-6, kMaxEps);
  v.hidden_act = f.string("hidden_act", "gelu_pytorch_tanh");

  if (v.num_channels != 3) f.bad("num_channels", "must be 3 (RGB)");
  if (v.hidden_act != "gelu_pytorch_tanh")
    f.bad("hidden_act", fmt::format("unsupported '{}' (supported: gelu_pytorch_tanh)", printable(v.hidden_act)));
  if (v.hidden_size % v.num_heads != 0)
    f.bad("num_attention_heads", fmt::format("{} does not divide hidden_size {}", v.num_heads, v.hidden_size));
  if (v.image_size % v.patch_size != 0)
    f.bad("image_size", fmt::format("{} is not a multiple of patch_size {}", v.image_size, v.patch_size));
  // docs/gemma3/vision.md#projector: the patch grid average-pools to a square of mm_tokens_per_image tokens.
  const int pps = v.patches_per_side();
  if (pps % tokens_per_side != 0)
    f.bad("image_size", fmt::format("{} patches per side do not pool evenly to {} tokens per side "
                                    "(sqrt of mm_tokens_per_image)",
                                    pps, tokens_per_side));
  return v;
}

std::vector<int> parse_token_ids(const Fields& f, const char* key, int vocab) {
  const json& v = f.at(key);
  std::vector<int> ids;
  auto one = [&](const json& x) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= vocab)
      f.bad(key, fmt::format("{} is not a token id in [0, {})", x.dump(), vocab));
    ids.push_back(int(x.get<int64_t>()));
  };
  if (v.is_array()) {
    if (v.empty()) f.bad(key, "must not be an empty list");
    for (const json& x : v) one(x);
  } else {
    one(v);
  }
  return ids;
}

std::optional<DType> parse_torch_dtype(const Fields& f) {
  const char* key = f.has("torch_dtype") ? "torch_dtype" : "dtype";
  const std::string s = f.has(key) && f.at(key).is_string() ? f.at(key).get<std::string>() : "";
  if (s == "bfloat16") return DType::BF16;
  if (s == "float16") return DType::F16;
  if (s == "float32") return DType::F32;
  return std::nullopt;  // informational only: the stored dtype is what counts
}

}  // namespace

int ModelConfig::tokens_per_side() const { return int(std::lround(std::sqrt(double(mm_tokens_per_image)))); }

PreprocessorConfig effective_preprocessor(const ModelConfig& c) {
  if (!c.vision) fail("config.json has no vision_config (not a Gemma 3 VLM)");
  if (c.preprocessor) return *c.preprocessor;
  PreprocessorConfig pp;
  pp.height = pp.width = c.vision->image_size;
  return pp;
}

std::string_view layer_kind_name(LayerKind k) { return k == LayerKind::Sliding ? "sliding" : "global"; }

ModelConfig parse_config(const std::string& json_text, const std::string& where) {
  const json j = parse_json(json_text, where);
  if (!j.is_object()) fail("{}: must be a JSON object", where);
  const Fields top(j, where, "");
  ModelConfig c;

  if (top.has("architectures")) {
    const json& a = top.at("architectures");
    if (!a.is_array() || a.empty() || !a[0].is_string()) top.bad("architectures", "must be a non-empty list of strings");
    c.architecture = a[0].get<std::string>();
  } else {
    // Some re-saves omit `architectures`; model_type then decides.
    const std::string mt = top.string("model_type", "");
    if (mt == "gemma3") c.architecture = "Gemma3ForConditionalGeneration";
    else if (mt == "gemma3_text") c.architecture = "Gemma3ForCausalLM";
    else top.bad("architectures", "missing (and model_type is neither gemma3 nor gemma3_text)");
  }
  if (c.architecture == "Gemma3ForConditionalGeneration")
    c.arch = Arch::ConditionalGeneration;
  else if (c.architecture == "Gemma3ForCausalLM")
    c.arch = Arch::CausalLM;
  else
    top.bad("architectures", fmt::format("unsupported architecture '{}' (supported: "
                                         "Gemma3ForConditionalGeneration, Gemma3ForCausalLM)",
                                         printable(c.architecture)));

  const Fields text = c.is_vlm() ? top.sub("text_config") : top;
  c.text = parse_text(text);
  const int vocab = c.text.vocab_size;

  if (c.is_vlm()) {
    c.mm_tokens_per_image = top.dim("mm_tokens_per_image", 256);
    const int side = c.tokens_per_side();
    if (side * side != c.mm_tokens_per_image) top.bad("mm_tokens_per_image", "must be a perfect square");
    c.vision = parse_vision(top.sub("vision_config"), side);
    // Both spellings appear in the wild (docs/gemma3/config.md#top-level); they must agree when both are given.
    auto token = [&](const char* index_key, const char* id_key, int def) {
      const int64_t a = top.integer(index_key, def, 0, std::numeric_limits<int>::max());
      const int64_t b = top.integer(id_key, a, 0, std::numeric_limits<int>::max());
      if (a != b) top.bad(id_key, fmt::format("{} disagrees with {} {}", b, index_key, a));
      return int(a);
    };
    c.boi_token_id = token("boi_token_index", "boi_token_id", 255999);
    c.eoi_token_id = token("eoi_token_index", "eoi_token_id", 256000);
    c.image_token_id = token("image_token_index", "image_token_id", 262144);
    if (c.boi_token_id >= vocab) top.bad("boi_token_index", fmt::format("{} is outside vocab_size {}", c.boi_token_id, vocab));
    if (c.eoi_token_id >= vocab) top.bad("eoi_token_index", fmt::format("{} is outside vocab_size {}", c.eoi_token_id, vocab));
    // HF also has tie_word_embeddings on the outer config; it must not contradict the text one.
    if (top.has("tie_word_embeddings")) {
      const bool outer = top.boolean("tie_word_embeddings", true);
      if (text.has("tie_word_embeddings") && outer != c.text.tie_word_embeddings)
        top.bad("tie_word_embeddings", "disagrees with text_config.tie_word_embeddings");
      c.text.tie_word_embeddings = outer;
    }
  }

  // Special ids: the outer config first, then text_config (VLM).
  auto pick = [&](const char* key) -> const Fields* {
    if (top.has(key)) return &top;
    if (c.is_vlm() && text.has(key)) return &text;
    return nullptr;
  };
  if (const Fields* f = pick("eos_token_id")) c.eos_token_ids = parse_token_ids(*f, "eos_token_id", vocab);
  if (const Fields* f = pick("bos_token_id")) c.bos_token_id = parse_token_ids(*f, "bos_token_id", vocab).at(0);
  if (const Fields* f = pick("pad_token_id")) c.pad_token_id = parse_token_ids(*f, "pad_token_id", vocab).at(0);
  c.torch_dtype = parse_torch_dtype(top);
  if (!c.torch_dtype && c.is_vlm()) c.torch_dtype = parse_torch_dtype(text);
  return c;
}

PreprocessorConfig parse_preprocessor_config(const std::string& json_text, const std::string& where,
                                             const ModelConfig& model) {
  const json j = parse_json(json_text, where);
  if (!j.is_object()) fail("{}: must be a JSON object", where);
  const Fields f(j, where, "");
  PreprocessorConfig p;

  const std::string type = f.string("image_processor_type", "Gemma3ImageProcessor");
  if (type != "Gemma3ImageProcessor" && type != "Gemma3ImageProcessorFast")
    f.bad("image_processor_type", fmt::format("unsupported '{}' (expected Gemma3ImageProcessor)", printable(type)));
  // Gemma3ImageProcessor's own default size is 224x224.
  if (f.has("size")) {
    const Fields size = f.sub("size");
    p.height = size.dim("height", std::nullopt, kMaxSide);
    p.width = size.dim("width", std::nullopt, kMaxSide);
  } else {
    p.height = p.width = 224;
  }
  p.resample = int(f.integer("resample", 2, 0, 5));
  p.do_resize = f.boolean("do_resize", true);
  p.do_rescale = f.boolean("do_rescale", true);
  p.do_normalize = f.boolean("do_normalize", true);
  p.do_convert_rgb = f.boolean("do_convert_rgb", true);
  p.rescale_factor = f.positive("rescale_factor", 1.0 / 255, 1.0, 1e-9);
  for (const char* key : {"image_mean", "image_std"}) {
    float* dst = key[6] == 'm' ? p.image_mean : p.image_std;
    if (!f.has(key)) continue;
    const json& v = f.at(key);
    // HF accepts one number for all channels or one per channel.
    if (v.is_number()) {
      dst[0] = dst[1] = dst[2] = v.get<float>();
    } else if (v.is_array() && v.size() == 3 && v[0].is_number() && v[1].is_number() && v[2].is_number()) {
      for (int i = 0; i < 3; ++i) dst[i] = v[i].get<float>();
    } else {
      f.bad(key, "must be a number or a list of 3 numbers");
    }
    for (int i = 0; i < 3; ++i)
      if (!pixel_stat_in_range(dst[i], dst == p.image_std))
        f.bad(key, fmt::format("values must be in [{}, 1e+06], got {}", dst == p.image_std ? "1e-06" : "-1e+06",
                               v.dump()));
  }
  p.do_pan_and_scan = f.boolean("do_pan_and_scan", false);
  p.pan_and_scan_min_crop_size = f.dim("pan_and_scan_min_crop_size", 256, kMaxSide);
  p.pan_and_scan_max_num_crops = f.dim("pan_and_scan_max_num_crops", 4, 1 << 10);
  p.pan_and_scan_min_ratio_to_activate = f.positive("pan_and_scan_min_ratio_to_activate", 1.2);

  if (model.vision) {
    const int s = model.vision->image_size;
    if (p.height != s || p.width != s)
      f.bad("size", fmt::format("{}x{} does not match vision_config.image_size {}", p.height, p.width, s));
  }
  if (f.has("image_seq_length") && f.integer("image_seq_length", 0, 1, kMaxDim) != model.mm_tokens_per_image)
    f.bad("image_seq_length", fmt::format("does not match mm_tokens_per_image {}", model.mm_tokens_per_image));
  return p;
}

ModelConfig load_config(const std::filesystem::path& dir) {
  const auto path = dir / "config.json";
  ModelConfig c = parse_config(read_text_file(path), path.string());
  if (c.eos_token_ids.empty()) {
    const auto gen = dir / "generation_config.json";
    if (std::filesystem::exists(gen)) {
      const json j = parse_json(read_text_file(gen), gen.string());
      if (!j.is_object()) fail("{}: must be a JSON object", gen.string());
      const Fields f(j, gen.string(), "");
      if (f.has("eos_token_id")) c.eos_token_ids = parse_token_ids(f, "eos_token_id", c.text.vocab_size);
    }
    if (c.eos_token_ids.empty()) c.eos_token_ids = {1};  // Gemma3TextConfig default
  }
  if (c.is_vlm()) {
    const auto pre = dir / "preprocessor_config.json";
    if (std::filesystem::exists(pre)) c.preprocessor = parse_preprocessor_config(read_text_file(pre), pre.string(), c);
  }
  return c;
}

}  // namespace vlm
