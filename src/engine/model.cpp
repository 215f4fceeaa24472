#include "engine/model.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "models/gemma3/registry.h"
#include "text/gguf_vocab.h"

namespace vlm::engine {

std::shared_ptr<const Model> Model::load(const std::filesystem::path& dir, const ModelOptions& opt) {
  if (opt.threads < 0) fail("threads must be >= 1, got {}", opt.threads);
  Checkpoint ck = models::gemma3::open_checkpoint(dir, Parts{.text = true, .vision = opt.vision}, opt.mmproj);
  return std::shared_ptr<const Model>(new Model(std::move(ck), opt));
}

Model::Model(Checkpoint ck, const ModelOptions& opt) : ck_(std::move(ck)), opt_(opt) {
  const ModelConfig& mc = ck_.config();
  if (opt.context < 0 || opt.context > mc.text.max_position_embeddings)
    fail("context {} outside [1, max_position_embeddings {}]", opt.context, mc.text.max_position_embeddings);
  context_ = opt.context > 0 ? opt.context : mc.text.max_position_embeddings;
  host_.mask_mode = opt.mask_mode.value_or(parse_mask_mode(default_mask_mode(mc)));
  host_.image_scaling = opt.image_scaling;
  host_.pan_and_scan = opt.pan_and_scan;
  host_.context = context_;
  host_.fault = opt.fault;
  identity_ = request_identity(ck_, host_, opt.embed_scaling);
  const kernels::Precision precision = opt.precision.value_or(kernels::parse_precision(
      default_precision(models::gemma3::layer_tensor(ck_, 0, models::gemma3::LayerTensor::Q).dtype), "precision"));
  add_precision(identity_, kernels::precision_name(precision));
  image_tokens_ = image_tokens_of(mc, opt.layout);
  if (ck_.gguf())
    tok_.emplace(text::tokenizer_from_gguf(*ck_.gguf()));
  else if (std::filesystem::exists(ck_.dir() / "tokenizer.json"))
    tok_.emplace(text::Tokenizer::load(ck_.dir()));
  if (opt.vision && mc.is_vlm()) enc_.emplace(ck_);
  pool_ = std::make_unique<ThreadPool>(opt.threads > 0 ? opt.threads : default_threads());
  exec_ = std::make_unique<const kernels::Exec>(*pool_, opt.isa.value_or(kernels::best_isa()), precision);
  decoder_ = std::make_unique<const models::gemma3::Decoder>(ck_, *exec_, opt.embed_scaling);
  // Every request reads them: map them in one call, not one fault per page (mlock maps them too).
  if (opt.mlock)
    ck_.lock_pages();
  else
    ck_.map_pages();
}

std::string Model::no_vision_tower() const {
  return fmt::format("the checkpoint ({}) has no vision tower{}", config().architecture,
                     ck_.gguf() ? " (a GGUF model's is in its mmproj file: --mmproj FILE)" : "");
}

bool Model::has_chat_template() const { return tok_ && text::is_gemma3_chat_template(tok_->chat_template()); }

int Model::vocab_limit() const {
  // Ids from image_token_id up are the VLM's vocabulary padding: never sampled.
  return config().is_vlm() ? std::min(config().image_token_id, vocab()) : vocab();
}

const grammar::Vocabulary& Model::vocabulary() const {
  if (!tok_) fail("response formats need a tokenizer, and {} has no tokenizer.json", dir().string());
  std::call_once(vocabulary_once_, [&] {
    vocabulary_ = std::make_unique<const grammar::Vocabulary>(grammar::token_bytes(*tok_, vocab_limit()));
  });
  return *vocabulary_;
}

std::vector<int> Model::crops_of(const std::vector<vision::RgbImage>& images) const {
  if (images.empty()) return {};
  if (!config().is_vlm()) fail("{} image(s) given, but {}", images.size(), no_vision_tower());
  if (!enc_) fail("{} image(s) given, but the model was loaded without its vision tower", images.size());
  return crops_per_image(*enc_, images, opt_.pan_and_scan);
}

std::vector<int32_t> Model::expand(std::span<const text::Segment> segments,
                                   const std::vector<vision::RgbImage>& images, bool parse_special) const {
  if (image_tokens_.boi >= 0) text::check_image_tokens(image_tokens_, *tok_);
  const std::vector<int> crops = crops_of(images);
  std::vector<int32_t> ids = text::tokenize_prompt(segments, *tok_, image_tokens_, crops, parse_special).ids;
  if (ids.empty()) fail("the prompt has no tokens");
  return ids;
}

std::vector<int32_t> Model::chat_prompt(std::span<const text::ChatMessage> messages,
                                        const std::vector<vision::RgbImage>& images, text::ChatEnd end) const {
  if (!tok_) fail("{} has no tokenizer.json", dir().string());
  if (!has_chat_template()) fail("{}: the chat template is not the Gemma 3 one; use a raw prompt", dir().string());
  return expand(text::render_gemma3_chat(messages, *tok_, end), images, false);
}

std::vector<int32_t> Model::raw_prompt(std::string_view text, const std::vector<vision::RgbImage>& images) const {
  if (!tok_) fail("{} has no tokenizer.json", dir().string());
  const text::Tokenizer& tok = *tok_;
  const bool has_bos = !tok.bos_token().empty() && text.starts_with(tok.bos_token());
  if (images.empty()) {
    std::vector<int32_t> ids = tok.encode(text, {.parse_special = true, .add_special = !has_bos});
    if (ids.empty()) fail("the prompt has no tokens");
    return ids;
  }
  // HF's processor on raw text: every "<start_of_image>" in it is an image slot.
  std::vector<text::Segment> seg;
  const std::optional<int32_t> bos = tok.token_id(tok.bos_token());
  if (!tok.bos_token().empty() && bos && !has_bos) seg.push_back({text::Segment::Kind::Control, *bos, {}});
  seg.push_back({text::Segment::Kind::Text, -1, std::string(text)});
  return expand(seg, images, true);
}

MultimodalPrefill Model::prefill_input(std::span<const int32_t> ids, const std::vector<vision::RgbImage>& images,
                                       int pad_to) const {
  HostOptions o = host_;
  o.pad_to = pad_to;
  return build_prefill(*decoder_, config(), vision(), ids, images, o, *exec_);
}

}  // namespace vlm::engine
