#include "models/gemma3/registry.h"

#include "core/error.h"
#include "vision/siglip.h"

namespace vlm::models::gemma3 {

namespace {
constexpr LayerTensor kLayerTensors[] = {
    LayerTensor::Q,         LayerTensor::K,            LayerTensor::V,         LayerTensor::O,
    LayerTensor::Gate,      LayerTensor::Up,           LayerTensor::Down,      LayerTensor::InputNorm,
    LayerTensor::PostAttnNorm, LayerTensor::PreFfNorm, LayerTensor::PostFfNorm, LayerTensor::QNorm,
    LayerTensor::KNorm};
}  // namespace

std::string layer_tensor_name(int layer, LayerTensor t) {
  const char* rest = "";
  switch (t) {
    case LayerTensor::Q: rest = "self_attn.q_proj.weight"; break;
    case LayerTensor::K: rest = "self_attn.k_proj.weight"; break;
    case LayerTensor::V: rest = "self_attn.v_proj.weight"; break;
    case LayerTensor::O: rest = "self_attn.o_proj.weight"; break;
    case LayerTensor::Gate: rest = "mlp.gate_proj.weight"; break;
    case LayerTensor::Up: rest = "mlp.up_proj.weight"; break;
    case LayerTensor::Down: rest = "mlp.down_proj.weight"; break;
    case LayerTensor::InputNorm: rest = "input_layernorm.weight"; break;
    case LayerTensor::PostAttnNorm: rest = "post_attention_layernorm.weight"; break;
    case LayerTensor::PreFfNorm: rest = "pre_feedforward_layernorm.weight"; break;
    case LayerTensor::PostFfNorm: rest = "post_feedforward_layernorm.weight"; break;
    case LayerTensor::QNorm: rest = "self_attn.q_norm.weight"; break;
    case LayerTensor::KNorm: rest = "self_attn.k_norm.weight"; break;
  }
  return "text.layers." + std::to_string(layer) + "." + rest;
}

std::vector<int64_t> layer_tensor_shape(const TextConfig& c, LayerTensor t) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, d = c.head_dim;
  const int64_t q = int64_t(c.num_heads) * d, kv = int64_t(c.num_kv_heads) * d;
  switch (t) {
    case LayerTensor::Q: return {q, H};
    case LayerTensor::K:
    case LayerTensor::V: return {kv, H};
    case LayerTensor::O: return {H, q};
    case LayerTensor::Gate:
    case LayerTensor::Up: return {I, H};
    case LayerTensor::Down: return {H, I};
    case LayerTensor::QNorm:
    case LayerTensor::KNorm: return {d};
    default: return {H};
  }
}

std::vector<TensorSpec> tensor_registry(const ModelConfig& c) {
  std::vector<TensorSpec> e;
  const TextConfig& t = c.text;
  const int64_t H = t.hidden_size;
  e.push_back({"text.embed_tokens.weight", {t.vocab_size, H}});
  e.push_back({"text.norm.weight", {H}});
  e.push_back({"lm_head.weight", {t.vocab_size, H}, !t.tie_word_embeddings});
  for (int l = 0; l < t.num_layers; ++l)
    for (LayerTensor lt : kLayerTensors) e.push_back({layer_tensor_name(l, lt), layer_tensor_shape(t, lt)});
  if (!c.vision) return e;
  vision::siglip_tensors(*c.vision, e);
  // The one [in, out] matrix: vision width -> text width.
  const int64_t Hv = c.vision->hidden_size;
  e.push_back({"projector.mm_input_projection_weight", {Hv, H}});
  e.push_back({"projector.mm_soft_emb_norm.weight", {Hv}});
  return e;
}

Checkpoint open_checkpoint(const std::filesystem::path& path, Parts parts, const std::filesystem::path& mmproj) {
  return Checkpoint::open_path(path, mmproj, parts, tensor_registry);
}

const TensorView& registry_tensor(const Checkpoint& ck, std::string_view name) {
  for (const TensorSpec& t : tensor_registry(ck.config()))
    if (t.name == name) return ck.get(name, t.shape);
  fail("tensor '{}' is not in the Gemma 3 registry", name);
}

const TensorView& layer_tensor(const Checkpoint& ck, int layer, LayerTensor t) {
  const std::vector<int64_t> shape = layer_tensor_shape(ck.config().text, t);
  return ck.get(layer_tensor_name(layer, t), shape);
}

}  // namespace vlm::models::gemma3
