#include "text/detokenizer.h"

namespace vlm::text {

namespace {

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// True when s[i..] is the start of a valid UTF-8 sequence that is merely
// missing its last bytes (so more byte tokens could still complete it).
bool incomplete_prefix(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned c = b(i);
  size_t need;
  if (c >= 0xC2 && c <= 0xDF) need = 2;
  else if (c >= 0xE0 && c <= 0xEF) need = 3;
  else if (c >= 0xF0 && c <= 0xF4) need = 4;
  else return false;
  const size_t have = s.size() - i;
  if (have >= need) return false;
  for (size_t k = 1; k < have; ++k) {
    const unsigned x = b(i + k);
    if ((x & 0xC0) != 0x80) return false;
    if (k == 1) {  // the second byte's narrower ranges (no overlongs, surrogates, > U+10FFFF)
      if ((c == 0xE0 && x < 0xA0) || (c == 0xED && x >= 0xA0) || (c == 0xF0 && x < 0x90) || (c == 0xF4 && x >= 0x90))
        return false;
    }
  }
  return true;
}

}  // namespace

void StreamDecoder::drain(std::string& out, bool final) {
  size_t i = 0;
  while (i < pending_.size()) {
    if (const size_t len = utf8_sequence_length(pending_, i)) {
      out.append(pending_, i, len);
      i += len;
    } else if (!final && incomplete_prefix(pending_, i)) {
      break;  // wait for the rest of this character
    } else {
      out += kReplacementChar;
      ++i;
    }
  }
  pending_.erase(0, i);
}

std::string StreamDecoder::push(int32_t id) {
  std::string out;
  tok_->check_id(id);
  if (opt_.skip_special && tok_->is_special(id)) return out;
  if (const int b = tok_->byte_value(id); b >= 0) {
    pending_.push_back(char(b));
    drain(out, false);
    return out;
  }
  drain(out, true);  // a non-byte token ends the byte run
  tok_->append_piece(id, out);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out;
  drain(out, true);
  return out;
}

}  // namespace vlm::text
