#include "cli/prompt_args.h"

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>

#include "cli/options.h"
#include "core/error.h"
#include "io/file.h"
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
  app.add_option("--mmproj", mmproj, "GGUF models: the mmproj .gguf (default: the model folder's mmproj*.gguf)");
  app.add_option("--layout", layout, "tokens around images: hf (string expansion) or google (token splice)");
  app.add_flag("--pan-and-scan", pan_and_scan, "Pan & Scan crops follow each image (docs/gemma3/preprocessing.md#pan-and-scan)");
  add_mlock_option(app, mlock);
}

std::optional<kernels::Isa> isa_from_env() {
  const char* isa = std::getenv("VLM_ISA");
  if (!isa || !*isa) return std::nullopt;
  return kernels::parse_isa(isa, "VLM_ISA");
}

engine::ModelOptions ImageArgs::model_options() const {
  engine::ModelOptions o;
  if (!mask_mode.empty()) o.mask_mode = parse_mask_mode(mask_mode);
  o.image_scaling = parse_image_scaling(image_scaling);
  if (layout != "hf" && layout != "google") fail("--layout: expected hf or google, got '{}'", layout);
  o.layout = layout == "google" ? text::ImageLayout::Google : text::ImageLayout::HF;
  if (pan_and_scan) o.pan_and_scan = true;
  o.vision = !files.empty();
  o.mmproj = mmproj;
  o.mlock = mlock;
  // Kernel ISA path and the TEST-ONLY fault switches (multimodal/host.h): read here, at the
  // CLI's edge; the library reads no environment.
  o.isa = isa_from_env();
  const char* fault = std::getenv("VLM_FAULT");
  try {
    o.fault = parse_fault(fault ? fault : "");
  } catch (const Error& e) {
    fail("VLM_FAULT: {}", e.what());
  }
  return o;
}

std::vector<vision::RgbImage> ImageArgs::load(const std::filesystem::path& model_dir) const {
  if (files.empty()) return {};
  // A safetensors folder is checked here, before the weights load (a GGUF model without an
  // mmproj file is refused by the Model).
  if (!std::filesystem::exists(model_dir / "config.json")) return vision::load_images(files);
  const ModelConfig mc = load_config(model_dir);
  if (!mc.is_vlm()) fail("--image: {} is a text-only checkpoint ({})", model_dir.string(), mc.architecture);
  return vision::load_images(files);
}

std::vector<int32_t> PromptArgs::ids(const engine::Model& model, const std::vector<vision::RgbImage>& images) const {
  if (int(!prompt.empty()) + int(!tokens.empty()) + int(!messages.empty()) != 1)
    fail("give exactly one of --prompt, --tokens or --messages");
  if (raw && !messages.empty()) fail("--raw applies to --prompt, not --messages");
  if (!tokens.empty()) return parse_token_list(tokens, "--tokens");
  const char* opt = messages.empty() ? "--prompt" : "--messages";
  if (!model.tokenizer()) fail("{}: {} has no tokenizer.json", opt, model.dir().string());
  if (raw) return model.raw_prompt(prompt, images);
  if (!model.has_chat_template())
    fail("{}: the chat template is not the Gemma 3 one; use --raw", model.dir().string());
  std::vector<text::ChatMessage> msgs;
  if (!messages.empty()) {
    const std::string where = "--messages: " + messages;
    msgs = text::parse_messages(parse_json(read_text_file(messages, text::kMaxPromptBytes, "--messages: "), where),
                                where);
  } else {
    msgs.push_back(user_turn(prompt, images.size()));
  }
  return model.chat_prompt(msgs, images);
}

}  // namespace vlm::cli
