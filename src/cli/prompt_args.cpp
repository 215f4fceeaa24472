#include "cli/prompt_args.h"

#include <CLI/CLI.hpp>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/file.h"
#include "io/identity.h"
#include "io/json.h"
#include "multimodal/host.h"
#include "text/chat.h"

namespace vlm::cli {

std::vector<int32_t> parse_token_list(const std::string& text, const char* what) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_array()) fail("{}: expected a JSON list of token ids", what);
  std::vector<int32_t> ids;
  for (const auto& v : j) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
        v.get<int64_t>() > std::numeric_limits<int32_t>::max())
      fail("{}: '{}' is not a token id", what, shorten(v.dump()));
    ids.push_back(int32_t(v.get<int64_t>()));
  }
  if (ids.empty()) fail("{}: the list is empty", what);
  return ids;
}

void PromptArgs::add(CLI::App& app) {
  app.add_option("--prompt", prompt, "prompt text (chat template unless --raw)");
  app.add_option("--tokens", tokens, "prompt as a JSON list of token ids (used raw)");
  app.add_option("--messages", messages,
                 "JSON file: OpenAI-style message list; its image parts take the --image files in order");
  app.add_flag("--raw", raw, "no chat template");
}

void ImageArgs::add(CLI::App& app) {
  app.add_option("--image", files, "image file (repeatable), in prompt order");
  app.add_option("--mask-mode", mask_mode, "prefill mask: hf, mlx or causal (default: hf for VLMs, causal for text)");
  app.add_option("--image-scaling", image_scaling,
                 "reference (image rows unscaled) or mlx (pre-divided, then the whole sequence scaled)");
  app.add_option("--layout", layout, "tokens around images: hf (string expansion) or google (token splice)");
  app.add_flag("--pan-and-scan", pan_and_scan, "Pan & Scan crops follow each image (spec 5.4)");
}

HostOptions ImageArgs::host_options(const ModelConfig& mc) const {
  HostOptions o;
  o.mask_mode = parse_mask_mode(mask_mode.empty() ? default_mask_mode(mc) : mask_mode);
  o.image_scaling = parse_image_scaling(image_scaling);
  if (pan_and_scan) o.pan_and_scan = true;
  return o;
}

ImageInputs load_image_inputs(const ImageArgs& a, const Checkpoint& ck) {
  if (a.layout != "hf" && a.layout != "google") fail("--layout: expected hf or google, got '{}'", a.layout);
  ImageInputs in;
  const ModelConfig& mc = ck.config();
  in.tokens = image_tokens_of(mc, a.layout == "google" ? text::ImageLayout::Google : text::ImageLayout::HF);
  if (a.files.empty()) return in;
  if (!mc.is_vlm()) fail("--image: {} is a text-only checkpoint ({})", ck.dir().string(), mc.architecture);
  in.images = vision::load_images(a.files);
  in.encoder.emplace(ck);
  in.crops = crops_per_image(*in.encoder, in.images, a.pan_and_scan ? std::optional<bool>(true) : std::nullopt);
  return in;
}

Prompt make_prompt(const PromptArgs& a, const std::filesystem::path& model_dir, const text::ImageTokens& it,
                   std::span<const int> crops) {
  if (int(!a.prompt.empty()) + int(!a.tokens.empty()) + int(!a.messages.empty()) != 1)
    fail("give exactly one of --prompt, --tokens or --messages");
  if (a.raw && !a.messages.empty()) fail("--raw applies to --prompt, not --messages");
  Prompt p;
  const bool have_tokenizer = std::filesystem::exists(model_dir / "tokenizer.json");
  if (!a.tokens.empty()) {
    p.ids = parse_token_list(a.tokens, "--tokens");
    if (have_tokenizer) p.tokenizer = text::Tokenizer::load(model_dir);
    return p;
  }
  const char* opt = a.messages.empty() ? "--prompt" : "--messages";
  if (!have_tokenizer) fail("{}: {} has no tokenizer.json", opt, model_dir.string());
  p.tokenizer = text::Tokenizer::load(model_dir);
  const text::Tokenizer& tok = *p.tokenizer;
  if (it.boi >= 0) text::check_image_tokens(it, tok);
  if (a.raw && crops.empty()) {
    const bool has_bos = !tok.bos_token().empty() && a.prompt.starts_with(tok.bos_token());
    p.ids = tok.encode(a.prompt, {.parse_special = true, .add_special = !has_bos});
  } else if (a.raw) {
    // HF's processor on raw text: every "<start_of_image>" in it is an image slot.
    std::vector<text::Segment> seg;
    const std::optional<int32_t> bos = tok.token_id(tok.bos_token());
    if (!tok.bos_token().empty() && bos && !a.prompt.starts_with(tok.bos_token()))
      seg.push_back({text::Segment::Kind::Control, *bos, {}});
    seg.push_back({text::Segment::Kind::Text, -1, a.prompt});
    p.ids = text::tokenize_prompt(seg, tok, it, crops, true).ids;
  } else {
    if (!text::is_gemma3_chat_template(tok.chat_template()))
      fail("{}: the chat template is not the Gemma 3 one; use --raw", model_dir.string());
    std::vector<text::ChatMessage> msgs;
    if (!a.messages.empty()) {
      const std::string where = "--messages: " + a.messages;
      msgs = text::parse_messages(parse_json(read_text_file(a.messages, text::kMaxPromptBytes, "--messages: "), where),
                                  where);
    } else {
      msgs.push_back(user_turn(a.prompt, crops.size()));
    }
    const std::vector<text::Segment> seg = text::render_gemma3_chat(msgs, tok, true);
    p.ids = text::tokenize_prompt(seg, tok, it, crops).ids;
  }
  if (p.ids.empty()) fail("{}: the prompt has no tokens", opt);
  return p;
}

}  // namespace vlm::cli
