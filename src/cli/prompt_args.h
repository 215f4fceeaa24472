// Prompt inputs shared by `vlm run` and `vlm dump`: --tokens (a JSON id list, used as
// the raw prompt) or --prompt (the Gemma 3 chat template around one user turn, unless
// --raw: then the text as HF's tokenizer(text) reads it — special tokens parsed, <bos>
// prepended unless the text already starts with it).
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace vlm::cli {

struct PromptArgs {
  std::string prompt;  // --prompt
  std::string tokens;  // --tokens "[2,105,...]"
  bool raw = false;    // --raw: no chat template
};

struct Prompt {
  std::vector<int32_t> ids;
  std::optional<text::Tokenizer> tokenizer;  // loaded when the folder has tokenizer.json
};

// Exactly one of --prompt / --tokens must be given; --prompt needs tokenizer.json.
Prompt make_prompt(const PromptArgs& a, const std::filesystem::path& model_dir);
// Parses a JSON list of token ids; `what` names the option in errors.
std::vector<int32_t> parse_token_list(const std::string& json, const char* what);

}  // namespace vlm::cli
