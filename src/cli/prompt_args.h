// Prompt inputs shared by `vlm run` and `vlm dump`: --tokens (a JSON id list, used as
// the raw prompt) or --prompt (chat template unless --raw).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace vlm::cli {

struct PromptArgs {
  std::string prompt;  // --prompt
  std::string tokens;  // --tokens "[2,105,...]"
  bool raw = false;    // --raw: no chat template
};

// The prompt ids; exactly one of --prompt / --tokens must be given.
std::vector<int32_t> prompt_ids(const PromptArgs& a, const std::filesystem::path& model_dir);
// Parses a JSON list of token ids; `what` names the option in errors.
std::vector<int32_t> parse_token_list(const std::string& json, const char* what);

}  // namespace vlm::cli
