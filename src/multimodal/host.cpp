#include "multimodal/host.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "io/identity.h"

namespace vlm {

Fault parse_fault(std::string_view s) {
  if (s.empty()) return Fault::None;
  if (s == "causal_mask") return Fault::CausalMask;
  if (s == "multiplicative_mask") return Fault::MultiplicativeMask;
  if (s == "double_scale") return Fault::DoubleScale;
  if (s == "no_image_prescale") return Fault::NoImagePrescale;
  fail("unknown fault '{}' (causal_mask, multiplicative_mask, double_scale, no_image_prescale)", s);
}

text::ImageTokens image_tokens_of(const ModelConfig& mc, text::ImageLayout layout) {
  text::ImageTokens it;
  it.layout = layout;
  if (!mc.is_vlm()) return it;
  it.boi = mc.boi_token_id;
  it.eoi = mc.eoi_token_id;
  it.soft = mc.image_token_id;
  it.tokens_per_image = mc.mm_tokens_per_image;
  return it;
}

std::vector<int> crops_per_image(const vision::VisionEncoder& enc, const std::vector<vision::RgbImage>& images,
                                 std::optional<bool> pan_and_scan) {
  const PreprocessorConfig& pp = enc.processor();
  std::vector<int> crops(images.size(), 0);
  if (!pan_and_scan.value_or(pp.do_pan_and_scan)) return crops;
  for (size_t i = 0; i < images.size(); ++i)
    crops[i] = int(vision::pan_and_scan_crops(images[i].width, images[i].height, pp).size());
  return crops;
}

text::ChatMessage user_turn(const std::string& text, size_t n_images) {
  text::ChatMessage m{"user", std::vector<text::ChatPart>(n_images, text::ChatPart{true, ""})};
  m.content.push_back(text::ChatPart{false, text});
  return m;
}

std::vector<int32_t> check_prompt(const ModelConfig& mc, const vision::VisionEncoder* enc,
                                  std::span<const int32_t> ids, const std::vector<vision::RgbImage>& images,
                                  const HostOptions& opt) {
  const int n = int(ids.size());
  if (n == 0) fail("the prompt has no tokens");
  if (!images.empty() && !mc.is_vlm())
    fail("{} image(s) given, but the checkpoint ({}) has no vision tower", images.size(), mc.architecture);
  if (!images.empty() && !enc) fail("images given without a vision encoder");

  // Cardinality (docs/gemma3/prompt.md): exactly mm_tokens_per_image soft tokens per encoded image
  // (an image and each of its Pan & Scan crops), before any compute.
  std::vector<int32_t> positions;
  if (mc.is_vlm())
    for (int i = 0; i < n; ++i)
      if (ids[size_t(i)] == mc.image_token_id) positions.push_back(i);
  std::vector<int> crops;
  if (enc) crops = crops_per_image(*enc, images, opt.pan_and_scan);
  const size_t encoded = images.size() + size_t(std::accumulate(crops.begin(), crops.end(), 0));
  const size_t want = encoded * size_t(std::max(mc.mm_tokens_per_image, 0));
  if (positions.size() != want)
    fail("the prompt has {} image soft tokens (id {}) but {} image(s){} need {} ({} per image)",
         positions.size(), mc.image_token_id, images.size(),
         encoded != images.size() ? fmt::format(" with {} crops", encoded - images.size()) : "", want,
         mc.mm_tokens_per_image);
  const int64_t context = opt.context > 0 ? opt.context : mc.text.max_position_embeddings;
  if (int64_t(n) > context)
    fail("the prompt of {} tokens ({} of them image tokens) exceeds the context limit of {}", n,
         positions.size(), context);
  return positions;
}

std::vector<float> prefill_rows(const TextEmbedder& emb, const ModelConfig& mc, std::span<const int32_t> ids,
                                int valid_len, std::span<const float> features, const HostOptions& opt) {
  const int H = emb.hidden();
  const float s = emb.normalizer();
  std::vector<float> rows = emb.embed(ids);
  if (opt.fault == Fault::DoubleScale)
    for (size_t i = 0; i < size_t(valid_len) * size_t(H); ++i) rows[i] *= s;
  if (!features.empty()) {
    const bool mlx = opt.image_scaling == ImageScaling::Mlx || opt.fault == Fault::NoImagePrescale;
    const float pre = mlx && opt.fault != Fault::NoImagePrescale ? s : 1.0f;
    merge_image_rows(ids.first(size_t(valid_len)), mc.image_token_id, features, H, pre, mlx ? s : 1.0f,
                     rows.data());
  }
  return rows;
}

PrefillMasks prefill_masks(const ModelConfig& mc, std::span<const int32_t> ids, int valid_len,
                           const HostOptions& opt) {
  const MaskMode mode = opt.fault == Fault::CausalMask ? MaskMode::Causal : opt.mask_mode;
  PrefillMasks m = build_masks(mode, ids, valid_len, int(ids.size()), mc.text.sliding_window,
                               mc.is_vlm() ? mc.image_token_id : -1);
  if (opt.fault == Fault::MultiplicativeMask)
    for (std::vector<float>* v : {&m.global, &m.sliding})
      for (float& x : *v) x = x == kMaskAllowed ? 1.0f : 0.0f;
  return m;
}

models::MaskSpec prefill_mask_spec(const ModelConfig& mc, std::span<const int32_t> ids, const HostOptions& opt,
                                   PrefillMasks& dense) {
  models::MaskSpec spec;
  spec.window = mc.text.sliding_window;
  if (opt.fault == Fault::MultiplicativeMask) {
    dense = prefill_masks(mc, ids, int(ids.size()), opt);
    spec.dense_global = &dense.global;
    spec.dense_sliding = dense.sliding.empty() ? nullptr : &dense.sliding;
    return spec;
  }
  spec.mode = opt.fault == Fault::CausalMask ? MaskMode::Causal : opt.mask_mode;
  if (spec.mode == MaskMode::Hf && mc.is_vlm()) spec.group = image_groups(ids, mc.image_token_id);
  return spec;
}

MultimodalPrefill build_prefill(const models::gemma3::Decoder& model, const ModelConfig& mc, const vision::VisionEncoder* enc,
                                std::span<const int32_t> ids, const std::vector<vision::RgbImage>& images,
                                const HostOptions& opt, const kernels::Exec& ex) {
  MultimodalPrefill r;
  r.image_positions = check_prompt(mc, enc, ids, images, opt);
  r.ids.assign(ids.begin(), ids.end());
  const int n = int(ids.size());
  const int Lp = opt.pad_to > 0 ? opt.pad_to : n;
  if (Lp < n) fail("--pad-to {} is shorter than the prompt ({} tokens)", Lp, n);
  // Padded rows cost like real ones (an [Lp, V] logits buffer in a dump): same limit.
  const int64_t context = opt.context > 0 ? opt.context : mc.text.max_position_embeddings;
  if (Lp > context) fail("--pad-to {} exceeds the context limit of {}", Lp, context);

  PrefillInput& in = r.input;
  in.Lp = Lp;
  in.valid_len = n;
  std::vector<int32_t> padded(ids.begin(), ids.end());
  padded.resize(size_t(Lp), mc.pad_token_id);
  if (!images.empty()) r.encoding = enc->encode(images, ex, opt.pan_and_scan);
  in.embeds = prefill_rows(model.embedder(), mc, padded, n,
                           r.encoding ? std::span<const float>(r.encoding->features) : std::span<const float>(),
                           opt);
  r.embed_norms = row_norms(in.embeds.data(), size_t(n), size_t(model.embedder().hidden()));
  PrefillMasks m = prefill_masks(mc, padded, n, opt);
  in.mask_global = std::move(m.global);
  in.mask_sliding = std::move(m.sliding);
  return r;
}

std::string scaling_policy_name(EmbedScaling text, DType embedding_dtype, ImageScaling image) {
  std::string s = text == EmbedScaling::F32 ? "f32-normalizer" : default_scaling_policy(embedding_dtype);
  if (image == ImageScaling::Mlx) s += "+mlx-image-prescale";
  return s;
}

Identity request_identity(const Checkpoint& ck, const HostOptions& opt, EmbedScaling text) {
  return make_identity(ck, mask_mode_name(opt.mask_mode),
                       scaling_policy_name(text, ck.get("text.embed_tokens.weight").dtype, opt.image_scaling));
}

}  // namespace vlm
