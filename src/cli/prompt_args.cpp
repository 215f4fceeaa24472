#include "cli/prompt_args.h"

#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"

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

std::vector<int32_t> prompt_ids(const PromptArgs& a, const std::filesystem::path&) {
  if (!a.prompt.empty() == !a.tokens.empty()) fail("give exactly one of --prompt or --tokens");
  if (!a.tokens.empty()) return parse_token_list(a.tokens, "--tokens");
  fail("--prompt needs the tokenizer, which this build does not have yet; use --tokens");
}

}  // namespace vlm::cli
