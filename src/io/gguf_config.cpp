#include "io/gguf_config.h"

#include "core/error.h"

namespace vlm {

namespace {

using namespace config_limits;

// A positive count up to hi (config.h's bounds, as for config.json).
int count(const GgufHeader& h, std::string_view key, int64_t hi = kMaxDim) {
  const uint64_t v = h.get_uint(key);
  if (v == 0 || v > uint64_t(hi)) fail("{}: key '{}' = {} is out of range [1, {}]", h.where, key, v, hi);
  return int(v);
}

int count_or(const GgufHeader& h, std::string_view key, int def, int64_t hi = kMaxDim) {
  return h.has(key) ? count(h, key, hi) : def;
}

// A finite value in (lo, hi].
double positive(const GgufHeader& h, std::string_view key, float def, double hi = kMaxScalar, double lo = 0) {
  const float v = h.get_f32_or(key, def);
  if (!(v > lo) || !(v <= hi)) fail("{}: key '{}' = {} is out of range ({}, {}]", h.where, key, v, lo, hi);
  return v;
}

// The token id at key: below the vocabulary size.
int token_id(const GgufHeader& h, std::string_view key, int vocab) {
  const uint64_t v = h.get_uint(key);
  if (v >= uint64_t(vocab)) fail("{}: key '{}' = {} is not below the vocabulary size {}", h.where, key, v, vocab);
  return int(v);
}

int piece_id(const GgufHeader& h, std::string_view piece) {
  const auto tokens = h.get_strings("tokenizer.ggml.tokens");
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] == piece) return int(i);
  fail("{}: tokenizer.ggml.tokens has no '{}'", h.where, piece);
}

}  // namespace

ModelConfig config_from_gguf(const GgufHeader& h, const GgufHeader* mm) {
  if (const auto arch = h.get_string("general.architecture"); arch != "gemma3")
    fail("{}: general.architecture is '{}', expected 'gemma3'", h.where, arch);
  ModelConfig c;
  TextConfig& t = c.text;
  const auto tokens = h.get_strings("tokenizer.ggml.tokens");
  if (tokens.empty() || tokens.size() > uint64_t(kMaxDim))
    fail("{}: tokenizer.ggml.tokens has {} entries, expected 1 to {}", h.where, tokens.size(), kMaxDim);
  t.vocab_size = int(tokens.size());
  t.hidden_size = count(h, "gemma3.embedding_length");
  t.intermediate_size = count(h, "gemma3.feed_forward_length");
  t.num_layers = count(h, "gemma3.block_count", kMaxLayers);
  t.num_heads = count_or(h, "gemma3.attention.head_count", 8, kMaxHeads);
  t.num_kv_heads = count_or(h, "gemma3.attention.head_count_kv", 4, kMaxHeads);
  t.head_dim = count_or(h, "gemma3.attention.key_length", 256, kMaxHeadDim);
  if (t.head_dim % 2 != 0) fail("{}: gemma3.attention.key_length {} is odd (RoPE rotates pairs)", h.where, t.head_dim);
  if (h.has("gemma3.attention.value_length") &&
      count(h, "gemma3.attention.value_length", kMaxHeadDim) != t.head_dim)
    fail("{}: gemma3.attention.value_length {} differs from key_length {}", h.where,
         h.get_uint("gemma3.attention.value_length"), t.head_dim);
  if (t.num_heads % t.num_kv_heads != 0)
    fail("{}: head_count {} is not a multiple of head_count_kv {}", h.where, t.num_heads, t.num_kv_heads);
  // llama.cpp (llama-model.cpp, LLM_ARCH_GEMMA3): 1/sqrt(H/nH) for the 62-layer model, else 1/sqrt(key_length).
  t.query_pre_attn_scalar = t.num_layers == 62 ? double(t.hidden_size / t.num_heads) : double(t.head_dim);
  t.rms_norm_eps = positive(h, "gemma3.attention.layer_norm_rms_epsilon", 1e-6f, kMaxEps);
  t.max_position_embeddings = count_or(h, "gemma3.context_length", 131072, kMaxPositions);
  t.sliding_window = count_or(h, "gemma3.attention.sliding_window", t.max_position_embeddings, kMaxPositions);
  t.layer_kinds.resize(size_t(t.num_layers));
  for (int i = 0; i < t.num_layers; ++i) t.layer_kinds[size_t(i)] = i % 6 < 5 ? LayerKind::Sliding : LayerKind::Global;
  t.rope_theta = positive(h, "gemma3.rope.freq_base", 1000000.0f, kMaxScalar, 1);  // below 1: 1/θ^k past f32
  t.rope_local_base_freq = 10000.0;
  if (h.has("gemma3.rope.scaling.type") && h.get_string("gemma3.rope.scaling.type") != "none") {
    t.rope_scaling_type = std::string(h.get_string("gemma3.rope.scaling.type"));
    if (t.rope_scaling_type != "linear")
      fail("{}: gemma3.rope.scaling.type '{}' is not supported (linear)", h.where, t.rope_scaling_type);
    t.rope_scaling_factor = positive(h, "gemma3.rope.scaling.factor", 1.0f, 1e6, 1e-6);
  }
  if (h.has("gemma3.final_logit_softcapping"))
    fail("{}: gemma3.final_logit_softcapping is set; Gemma 3 has none", h.where);
  const int vocab = t.vocab_size;
  if (h.has("tokenizer.ggml.bos_token_id")) c.bos_token_id = token_id(h, "tokenizer.ggml.bos_token_id", vocab);
  if (h.has("tokenizer.ggml.padding_token_id"))
    c.pad_token_id = token_id(h, "tokenizer.ggml.padding_token_id", vocab);
  // llama.cpp ends generation at the eos id and at <end_of_turn> (llama-vocab.cpp EOG tokens).
  if (h.has("tokenizer.ggml.eos_token_id"))
    c.eos_token_ids.push_back(token_id(h, "tokenizer.ggml.eos_token_id", vocab));
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] == "<end_of_turn>" && (c.eos_token_ids.empty() || c.eos_token_ids[0] != int(i)))
      c.eos_token_ids.push_back(int(i));

  if (!mm) {
    c.arch = Arch::CausalLM;
    c.architecture = "Gemma3ForCausalLM";
    return c;
  }
  if (const auto arch = mm->get_string("general.architecture"); arch != "clip")
    fail("{}: general.architecture is '{}', expected 'clip'", mm->where, arch);
  const std::string_view proj =
      mm->has("clip.projector_type") ? mm->get_string("clip.projector_type") : mm->get_string("clip.vision.projector_type");
  if (proj != "gemma3") fail("{}: clip.projector_type is '{}', expected 'gemma3'", mm->where, proj);
  if (const int d = count(*mm, "clip.vision.projection_dim"); d != t.hidden_size)
    fail("{}: clip.vision.projection_dim {} differs from {}'s gemma3.embedding_length {}", mm->where, d, h.where,
         t.hidden_size);
  c.arch = Arch::ConditionalGeneration;
  c.architecture = "Gemma3ForConditionalGeneration";
  VisionConfig v;
  v.hidden_size = count(*mm, "clip.vision.embedding_length");
  v.intermediate_size = count(*mm, "clip.vision.feed_forward_length");
  v.num_layers = count(*mm, "clip.vision.block_count", kMaxLayers);
  v.num_heads = count(*mm, "clip.vision.attention.head_count", kMaxHeads);
  v.image_size = count(*mm, "clip.vision.image_size", kMaxSide);
  v.patch_size = count(*mm, "clip.vision.patch_size", kMaxSide);
  v.layer_norm_eps = positive(*mm, "clip.vision.attention.layer_norm_epsilon", 1e-6f, kMaxEps);
  if (v.image_size % v.patch_size != 0 || v.hidden_size % v.num_heads != 0)
    fail("{}: image_size {} / patch_size {} or embedding_length {} / head_count {} is not whole", mm->where,
         v.image_size, v.patch_size, v.hidden_size, v.num_heads);
  // clip.cpp PROJECTOR_TYPE_GEMMA3: pooling factor 4 unless the file says otherwise.
  const int merge = count_or(*mm, "clip.vision.projector.scale_factor", 4);
  if (v.patches_per_side() % merge != 0)
    fail("{}: {} patches per side do not pool by {}", mm->where, v.patches_per_side(), merge);
  c.mm_tokens_per_image = (v.patches_per_side() / merge) * (v.patches_per_side() / merge);
  c.vision = v;
  PreprocessorConfig pp;
  pp.height = pp.width = v.image_size;
  for (auto [key, dst] : {std::pair{"clip.vision.image_mean", pp.image_mean}, {"clip.vision.image_std", pp.image_std}}) {
    if (!mm->has(key)) continue;
    const std::vector<float> a = mm->get_f32_array(key);
    if (a.size() != 3) fail("{}: {} has {} values, expected 3", mm->where, key, a.size());
    for (int i = 0; i < 3; ++i) {
      dst[i] = a[size_t(i)];
      if (!pixel_stat_in_range(dst[i], dst == pp.image_std))
        fail("{}: {}[{}] = {} is out of range", mm->where, key, i, dst[i]);
    }
  }
  c.preprocessor = pp;
  c.boi_token_id = piece_id(h, "<start_of_image>");
  c.eoi_token_id = piece_id(h, "<end_of_image>");
  // <image_soft_token> usually sits past the embedding rows in Gemma 3 GGUFs (images enter as
  // embeddings); then the placeholder id only has to be outside the vocabulary.
  c.image_token_id = t.vocab_size;
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] == "<image_soft_token>") c.image_token_id = int(i);
  return c;
}

}  // namespace vlm
