// libFuzzer target: the tokenizer built from a GGUF file's tokenizer.ggml.* metadata
// (text/gguf_vocab.h) on arbitrary file images.
// Checks: building it returns a tokenizer or throws vlm::Error; a built one encodes a fixed
// text and the file's own first pieces (spaced and unspaced, with and without parse_special)
// into ids below its vocabulary size, or refuses with vlm::Error; every id sequence it gives
// decodes to valid UTF-8; where the vocabulary holds a U+2581 piece and parse_special is off,
// encoding never fails and decode(encode(x)) == x with U+2581 read as a space, as the decoder's
// Replace step defines (a built tokenizer always has the 256 byte pieces, so byte fallback can
// spell anything).
// (Without a U+2581 piece a space is spelled by its three byte pieces, which the decoder's
// Replace step does not see: it gives U+2581 back, as HF's decoder chain does.)
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>

#include "core/error.h"
#include "io/gguf.h"
#include "text/gguf_vocab.h"
#include "text/tokenizer.h"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_gguf_vocab: check failed: %s\n", what);
    std::abort();
  }
}

std::string spaces_for_u2581(std::string s) {
  const std::string mark = "\xE2\x96\x81";
  for (size_t p = 0; (p = s.find(mark, p)) != std::string::npos; p += 1) s.replace(p, mark.size(), " ");
  return s;
}

void encode_checked(const vlm::text::Tokenizer& tok, const std::string& text, bool parse_special, bool round_trips) {
  std::vector<int32_t> ids;
  try {
    ids = tok.encode(text, {.parse_special = parse_special});
  } catch (const vlm::Error&) {
    check(!round_trips || parse_special, "encode refused valid UTF-8");
    return;
  }
  for (int32_t id : ids) check(id >= 0 && id < tok.vocab_size(), "encode gave an id outside the vocabulary");
  const std::string back = tok.decode(ids);
  check(vlm::text::utf8_first_invalid(back) == std::string::npos, "decode gave invalid UTF-8");
  if (round_trips && !parse_special) check(back == spaces_for_u2581(text), "decode(encode(x)) != x");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  try {
    const vlm::GgufHeader h = vlm::parse_gguf(file, "fuzz.gguf");
    const vlm::text::Tokenizer tok = vlm::text::tokenizer_from_gguf(h);
    const bool round_trips = tok.token_id("\xE2\x96\x81").has_value();
    // The file's own pieces (valid UTF-8: the builder checked them), so merges are reached.
    std::string joined, spaced;
    for (int32_t id = 0; id < tok.vocab_size() && id < 64; ++id) {
      joined += tok.token(id);
      spaced += std::string(tok.token(id)) + " ";
    }
    for (bool special : {false, true}) {
      encode_checked(tok, "Hello, w\xC3\xB6rld!\n\tcc ccc  \xF0\x9F\x99\x82 <start_of_turn>user", special, round_trips);
      encode_checked(tok, joined, special, round_trips);
      encode_checked(tok, spaced, special, round_trips);
    }
  } catch (const vlm::Error&) {
  }
  return 0;
}
