// Which tokens a matcher state allows next: every token whose bytes it takes, all of them. The
// vocabulary is held sorted by bytes, so tokens that share a prefix share the matcher's walk over
// it, and a dead prefix skips every token that begins with it (docs/structured-output.md, "Token
// masks").
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/matcher.h"
#include "text/tokenizer.h"

namespace vlm::grammar {

// What each id below `limit` adds to the text, as the streaming detokenizer (text/detokenizer.h)
// emits it: a byte-fallback token its byte, another its piece; special tokens nothing.
std::vector<std::string> token_bytes(const text::Tokenizer& tok, int32_t limit);

class Vocabulary {
 public:
  // `bytes[id]` is what token `id` adds to the text; empty for tokens never allowed (special
  // tokens, tokens that add nothing).
  explicit Vocabulary(std::vector<std::string> bytes);

  std::string_view bytes(int32_t id) const { return bytes_[size_t(id)]; }
  size_t size() const { return bytes_.size(); }

  // allowed[id] = 1 for every token the state takes whole, else 0 (allowed.size() == size()).
  void allowed(const Matcher::State& s, std::span<uint8_t> allowed) const;
  bool allows(const Matcher::State& s, int32_t id) const;

 private:
  std::vector<std::string> bytes_;
  std::vector<int32_t> order_;  // the ids with bytes, sorted by them
  std::vector<uint32_t> lcp_;   // bytes order_[k] shares with order_[k - 1] (0 for k = 0)
  std::vector<int32_t> plain_;  // code points of a token that is plain string text, else -1
  size_t longest_ = 0;
};

}  // namespace vlm::grammar
