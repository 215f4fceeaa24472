// Gemma 3 tokenizer: reads tokenizer.json / tokenizer_config.json as HF ships
// them and reproduces HF `tokenizers` (Rust) encode/decode exactly (docs/gemma3/prompt.md#tokenizer).
//
// Encode pipeline (what tokenizer.json declares for Gemma 3):
//   1. added tokens are matched on the raw text, leftmost-longest (all Gemma 3
//      added tokens are `normalized: false`);
//   2. the text between matches goes through the normalizer (Replace " " → "▁")
//      and the pre-tokenizer (Split on " ", MergedWithPrevious);
//   3. each piece is BPE-merged by merge rank; characters missing from the vocab
//      become their UTF-8 bytes as `<0xNN>` tokens (byte fallback).
// Other normalizer / pre-tokenizer / model / decoder types, and added tokens
// with lstrip, rstrip, single_word or normalized set, are refused at load time
// with an error naming the field, rather than tokenized differently from HF.
//
// Special tokens in text (EncodeOptions::parse_special):
//   false (default): only the NON-special added tokens ("\n\n", "<table>", tab
//     runs, "<unusedN>", ...) are matched; special control tokens typed in the
//     text (`<start_of_turn>`, `<bos>`, `<start_of_image>`, ...) stay literal
//     text and are BPE-encoded like any other characters. This is HF's
//     `split_special_tokens=True` and is what user text must get.
//   true: every added token is matched, as HF's tokenizer does by default.
//
// Invalid UTF-8 input is REFUSED: encode() throws vlm::Error naming the byte
// offset. HF never sees such input (Python `str` and Rust `&str` are valid
// UTF-8 by construction; decoding bytes in Python raises UnicodeDecodeError by
// default), so refusing keeps every id we produce one that HF could produce.
//
// Decode follows the declared decoder (Replace "▁" → " ", ByteFallback, Fuse):
// a run of consecutive `<0xNN>` tokens is joined into bytes; if the run is not
// valid UTF-8 it becomes one U+FFFD per byte token (HF Rust behaviour; the JS
// port differs here). Output is therefore always valid UTF-8.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace vlm::text {

struct EncodeOptions {
  bool parse_special = false;  // match special added tokens in the text (see above)
  bool add_special = false;    // apply the post-processor template (Gemma 3: prepend <bos>)
};

struct DecodeOptions {
  bool skip_special = false;  // drop ids of special added tokens
};

// A byte-fallback BPE vocabulary given by ids (GGUF's tokenizer.ggml.* keys: text/gguf_vocab.h):
// every piece is a BPE symbol; the merges are (a, b) → piece in rank order. It stands for the
// tokenizer.json of a Gemma 3 release (normalizer " " → U+2581, Split on " " merged with the
// previous piece, post-processor <bos> when `bos` is set, decoder U+2581 → " ", byte fallback,
// fuse) without writing and parsing that file.
struct PieceVocab {
  std::span<const std::string_view> pieces;  // by id; read during from_pieces only
  struct Added {
    int32_t id;
    bool special;  // matched only with parse_special (else in any text)
  };
  std::vector<Added> added;
  struct Merge {
    int32_t a, b, piece;
  };
  std::vector<Merge> merges;
  std::optional<int32_t> bos;
  std::string chat_template, bos_token;
};

class Tokenizer {
 public:
  // Reads DIR/tokenizer.json and DIR/tokenizer_config.json.
  static Tokenizer load(const std::filesystem::path& dir);
  // Builds from the two files' contents; `where` prefixes error messages.
  static Tokenizer from_json(std::string_view tokenizer_json, std::string_view config_json,
                             const std::string& where);
  // Throws vlm::Error for an id out of range or a merge whose halves do not spell its piece.
  static Tokenizer from_pieces(const PieceVocab& vocab, const std::string& where);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& opt = {}) const;
  // Appends the ids of `text` to `out` (no post-processor).
  void encode_append(std::string_view text, bool parse_special, std::vector<int32_t>& out) const;

  // Throws vlm::Error for an id outside [0, vocab_size()).
  std::string decode(std::span<const int32_t> ids, const DecodeOptions& opt = {}) const;

  int32_t vocab_size() const;  // number of ids, added tokens included
  std::optional<int32_t> token_id(std::string_view token) const;  // vocab or added token
  std::string_view token(int32_t id) const;  // raw token string; id must be valid
  bool is_special(int32_t id) const;         // a special added token
  int byte_value(int32_t id) const;          // 0..255 for `<0xNN>` tokens, else -1
  // Appends what a non-byte token decodes to (decoder's Replace steps applied).
  void append_piece(int32_t id, std::string& out) const;
  void check_id(int32_t id) const;  // throws for an out-of-range id

  // From tokenizer_config.json (empty when absent).
  const std::string& chat_template() const;
  const std::string& bos_token() const;

  struct Impl;  // opaque; defined in tokenizer.cpp

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// UTF-8 helpers shared by the tokenizer, the detokenizer and the chat template.
// Length of the valid UTF-8 sequence starting at s[i] (1..4), or 0 when the
// bytes there are not valid UTF-8 (overlong, surrogate, > U+10FFFF, truncated).
size_t utf8_sequence_length(std::string_view s, size_t i);
// Offset of the first invalid byte, or npos when `s` is valid UTF-8.
size_t utf8_first_invalid(std::string_view s);

}  // namespace vlm::text
