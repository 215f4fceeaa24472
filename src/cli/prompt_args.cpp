#include "cli/prompt_args.h"

#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/chat.h"

namespace vlm::cli {

std::vector<int32_t> parse_token_list(const std::string& text, const char* what) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_array()) fail("{}: expected a JSON list of token ids", what);
  std::vector<int32_t> ids;
  for (const auto& v : j) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
        v.get<int64_t>() > std::numeric_limits<int32_t>::max())
      fail("{}: '{}' is not a token id", what, v.dump());
    ids.push_back(int32_t(v.get<int64_t>()));
  }
  if (ids.empty()) fail("{}: the list is empty", what);
  return ids;
}

Prompt make_prompt(const PromptArgs& a, const std::filesystem::path& model_dir) {
  if (!a.prompt.empty() == !a.tokens.empty()) fail("give exactly one of --prompt or --tokens");
  Prompt p;
  const bool have_tokenizer = std::filesystem::exists(model_dir / "tokenizer.json");
  if (!a.tokens.empty()) {
    p.ids = parse_token_list(a.tokens, "--tokens");
    if (have_tokenizer) p.tokenizer = text::Tokenizer::load(model_dir);
    return p;
  }
  if (!have_tokenizer) fail("--prompt: {} has no tokenizer.json", model_dir.string());
  p.tokenizer = text::Tokenizer::load(model_dir);
  const text::Tokenizer& tok = *p.tokenizer;
  if (a.raw) {
    const bool has_bos = !tok.bos_token().empty() && a.prompt.starts_with(tok.bos_token());
    p.ids = tok.encode(a.prompt, {.parse_special = true, .add_special = !has_bos});
  } else {
    if (!text::is_gemma3_chat_template(tok.chat_template()))
      fail("{}: the chat template is not the Gemma 3 one; use --raw", model_dir.string());
    const text::ChatMessage user{"user", {text::ChatPart{false, a.prompt}}};
    const std::vector<text::Segment> seg = text::render_gemma3_chat({&user, 1}, tok, true);
    p.ids = text::tokenize_prompt(seg, tok, text::ImageTokens{}, {}).ids;
  }
  if (p.ids.empty()) fail("--prompt: the prompt has no tokens");
  return p;
}

}  // namespace vlm::cli
