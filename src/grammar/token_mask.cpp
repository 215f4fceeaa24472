#include "grammar/token_mask.h"

#include <algorithm>

namespace vlm::grammar {

std::vector<std::string> token_bytes(const text::Tokenizer& tok, int32_t limit) {
  std::vector<std::string> bytes(size_t(std::min(limit, tok.vocab_size())));
  for (size_t id = 0; id < bytes.size(); ++id) {
    if (tok.is_special(int32_t(id))) continue;
    if (const int b = tok.byte_value(int32_t(id)); b >= 0) bytes[id] = std::string(1, char(b));
    else tok.append_piece(int32_t(id), bytes[id]);
  }
  return bytes;
}

Vocabulary::Vocabulary(std::vector<std::string> bytes) : bytes_(std::move(bytes)) {
  for (size_t id = 0; id < bytes_.size(); ++id)
    if (!bytes_[id].empty()) order_.push_back(int32_t(id));
  std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) { return bytes_[size_t(a)] < bytes_[size_t(b)]; });
  // Plain string text: valid UTF-8 (text::utf8_sequence_length) without '"', '\\' or controls.
  plain_.assign(bytes_.size(), -1);
  for (size_t id = 0; id < bytes_.size(); ++id) {
    const std::string& t = bytes_[id];
    int32_t chars = 0;
    size_t i = 0;
    while (i < t.size()) {
      const uint8_t c = uint8_t(t[i]);
      const size_t len = text::utf8_sequence_length(t, i);
      if (len == 0 || c < 0x20 || c == '"' || c == '\\') break;
      i += len;
      ++chars;
    }
    if (!t.empty() && i == t.size()) plain_[id] = chars;
  }
  lcp_.assign(order_.size(), 0);
  for (size_t k = 0; k < order_.size(); ++k) {
    const std::string& t = bytes_[size_t(order_[k])];
    longest_ = std::max(longest_, t.size());
    if (k == 0) continue;
    const std::string& p = bytes_[size_t(order_[k - 1])];
    size_t n = 0;
    while (n < t.size() && n < p.size() && t[n] == p[n]) ++n;
    lcp_[k] = uint32_t(n);
  }
}

void Vocabulary::allowed(const Matcher::State& s, std::span<uint8_t> allowed) const {
  std::fill(allowed.begin(), allowed.end(), uint8_t(0));
  // at[d]: the state after the first d bytes of the token in hand; valid for d <= valid.
  thread_local std::vector<Matcher::State> at;
  if (at.size() < longest_ + 1) at.resize(longest_ + 1);
  at[0] = s;
  // Inside a string most tokens are plain text, taken or not by their length alone: a mask of
  // Gemma 3's vocabulary there took 34 ms walking them all, 0.7 ms so (docs/structured-output.md).
  const int64_t room = Matcher::string_room(s);
  size_t valid = 0;
  for (size_t k = 0; k < order_.size(); ++k) {
    const int32_t id = order_[k];
    if (room != Matcher::kNotInString && plain_[size_t(id)] >= 0) {
      allowed[size_t(id)] = room < 0 || plain_[size_t(id)] <= room;
      valid = std::min<size_t>(valid, lcp_[k]);  // the next token shares this much with the last walked
      continue;
    }
    const std::string& t = bytes_[size_t(id)];
    size_t d = std::min<size_t>(lcp_[k], valid);
    while (d < t.size() && Matcher::step(at[d], uint8_t(t[d]), at[d + 1])) ++d;
    valid = d;
    if (d == t.size()) {
      allowed[size_t(id)] = 1;
      continue;
    }
    // t[0..d] is dead, and so is every following token that begins with it.
    while (k + 1 < order_.size() && lcp_[k + 1] > d) ++k;
  }
}

bool Vocabulary::allows(const Matcher::State& s, int32_t id) const {
  const std::string& t = bytes_[size_t(id)];
  if (t.empty()) return false;
  thread_local Matcher::State a, b;
  a = s;
  for (char c : t) {
    if (!Matcher::step(a, uint8_t(c), b)) return false;
    std::swap(a, b);
  }
  return true;
}

}  // namespace vlm::grammar
