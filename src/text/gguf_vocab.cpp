#include "text/gguf_vocab.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/error.h"
#include "io/json.h"  // printable

namespace vlm::text {

namespace {

// llama.cpp's token types (llama-vocab.h LLAMA_TOKEN_TYPE_*).
enum TokenType : int32_t { Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };

// The vocabulary's pieces by content, for finding every way to write a piece as two pieces.
// Open addressing over a polynomial hash (mod 2^64) of the bytes: the hash of each prefix of a
// piece extends the previous one by a byte, and a suffix's follows from the prefix's and the
// whole piece's, so the two halves of every split are looked up without hashing them again.
// (std::unordered_map took 1.0-1.4 s for the 262k Gemma 3 pieces, most of a model's load.)
class PieceIndex {
 public:
  static constexpr uint64_t kBase = 0x100000001b3ull;

  static uint64_t extend(uint64_t h, char c) { return h * kBase + static_cast<unsigned char>(c) + 1; }

  // kBase^e (mod 2^64), by squaring: a few products beside each lookup's cache miss.
  static uint64_t power(size_t e) {
    uint64_t r = 1, b = kBase;
    for (; e; e >>= 1, b *= b)
      if (e & 1) r *= b;
    return r;
  }

  explicit PieceIndex(std::span<const std::string_view> pieces) : pieces_(pieces) {
    int bits = 1;
    while ((size_t(1) << bits) < 2 * pieces.size()) ++bits;
    shift_ = 64 - bits;
    slots_.assign(size_t(1) << bits, Slot{0, -1});
  }

  // Adds piece id (its hash h); returns the id of an equal piece already there, or -1.
  int32_t insert(uint64_t h, int32_t id) {
    for (size_t i = home(h);; i = (i + 1) & (slots_.size() - 1)) {
      Slot& e = slots_[i];
      if (e.id < 0) {
        e = {uint32_t(h), id};
        return -1;
      }
      if (e.tag == uint32_t(h) && pieces_[size_t(e.id)] == pieces_[size_t(id)]) return e.id;
    }
  }

  // The id of the piece equal to s (its hash h), or -1.
  int32_t find(uint64_t h, std::string_view s) const {
    for (size_t i = home(h);; i = (i + 1) & (slots_.size() - 1)) {
      const Slot& e = slots_[i];
      if (e.id < 0) return -1;
      if (e.tag == uint32_t(h) && pieces_[size_t(e.id)] == s) return e.id;
    }
  }

 private:
  struct Slot {
    uint32_t tag;  // the hash's low half
    int32_t id;    // -1: empty
  };
  size_t home(uint64_t h) const { return size_t((h * 0x9e3779b97f4a7c15ull) >> shift_); }

  std::span<const std::string_view> pieces_;
  std::vector<Slot> slots_;
  int shift_ = 0;
};

// SentencePiece's byte pieces: "<0x" two upper-case hex digits ">".
bool byte_name(std::string_view p) {
  auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F'); };
  return p.size() == 6 && p.starts_with("<0x") && hex(p[3]) && hex(p[4]) && p[5] == '>';
}

}  // namespace

Tokenizer tokenizer_from_gguf(const GgufHeader& h) {
  const std::string& where = h.where;
  if (const std::string_view m = h.get_string("tokenizer.ggml.model"); m != "llama")
    fail("{}: tokenizer.ggml.model is '{}'; only the SentencePiece-style 'llama' vocabulary is supported", where,
         printable(m));
  if (h.get_bool_or("tokenizer.ggml.add_space_prefix", true))
    fail("{}: tokenizer.ggml.add_space_prefix is true (or absent); Gemma 3 files set it false", where);
  const auto tokens = h.get_strings("tokenizer.ggml.tokens");
  const std::vector<float> scores = h.get_f32_array("tokenizer.ggml.scores");
  const std::vector<int32_t> types = h.get_i32_array("tokenizer.ggml.token_type");
  const size_t n = tokens.size();
  if (scores.size() != n || types.size() != n)
    fail("{}: tokenizer.ggml.tokens has {} entries but scores {} and token_type {}", where, n, scores.size(),
         types.size());
  if (n == 0 || n >= (1u << 24)) fail("{}: tokenizer.ggml.tokens has {} entries", where, n);

  PieceIndex index(tokens);
  std::vector<uint64_t> hash(n);
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i].empty()) fail("{}: tokenizer.ggml.tokens[{}] is empty", where, i);
    if (utf8_first_invalid(tokens[i]) != std::string_view::npos)
      fail("{}: tokenizer.ggml.tokens[{}] is not valid UTF-8", where, i);
    if (types[i] < Normal || types[i] > Byte)
      fail("{}: tokenizer.ggml.token_type[{}] = {} is not a llama.cpp token type (1-6)", where, i, types[i]);
    if (!std::isfinite(scores[i])) fail("{}: tokenizer.ggml.scores[{}] is not finite", where, i);
    // The decoder turns every <0xNN> piece into its byte, so a piece of another type with that
    // name would encode as its text and decode as a byte.
    if ((types[i] == Byte) != byte_name(tokens[i]))
      fail("{}: tokenizer.ggml.tokens[{}] '{}' has token_type {}; the pieces <0x00>-<0xFF>, and only they, are "
           "bytes (type 6)",
           where, i, printable(tokens[i]), types[i]);
    for (char c : tokens[i]) hash[i] = PieceIndex::extend(hash[i], c);
    if (const int32_t other = index.insert(hash[i], int32_t(i)); other >= 0)
      fail("{}: tokenizer.ggml.tokens: '{}' appears twice (ids {} and {})", where, printable(tokens[i]), other, i);
  }
  auto special_id = [&](const char* key) -> std::optional<int32_t> {
    if (!h.has(key)) return std::nullopt;
    const uint64_t id = h.get_uint(key);
    if (id >= n) fail("{}: {} = {} is not below the vocabulary size {}", where, key, id, n);
    return int32_t(id);
  };
  const auto bos = special_id("tokenizer.ggml.bos_token_id");
  // Checked, not used: the stop ids come from the model's config, and byte fallback leaves no
  // unknown token.
  special_id("tokenizer.ggml.eos_token_id"), special_id("tokenizer.ggml.unknown_token_id");
  const bool add_bos = h.get_bool_or("tokenizer.ggml.add_bos_token", true);
  if (add_bos && !bos) fail("{}: tokenizer.ggml.add_bos_token is set but tokenizer.ggml.bos_token_id is missing", where);

  PieceVocab v;
  v.pieces = tokens;
  // Every split of a normal or user-defined piece into two pieces, in score order. The hash of
  // p[k, L) is hash(p) − hash(p[0, k))·kBase^(L − k).
  for (size_t i = 0; i < n; ++i) {
    if (types[i] != Normal && types[i] != UserDefined) continue;
    const std::string_view p = tokens[i];
    uint64_t head = 0;  // hash of p[0, k)
    size_t hashed = 0;
    for (size_t k = utf8_sequence_length(p, 0); k < p.size(); k += utf8_sequence_length(p, k)) {
      for (; hashed < k; ++hashed) head = PieceIndex::extend(head, p[hashed]);
      const int32_t a = index.find(head, p.substr(0, k));
      if (a < 0) continue;
      const int32_t b = index.find(hash[i] - head * PieceIndex::power(p.size() - k), p.substr(k));
      if (b >= 0) v.merges.push_back({a, b, int32_t(i)});
    }
  }
  std::sort(v.merges.begin(), v.merges.end(), [&](const PieceVocab::Merge& x, const PieceVocab::Merge& y) {
    if (scores[x.piece] != scores[y.piece]) return scores[x.piece] > scores[y.piece];
    if (x.piece != y.piece) return x.piece < y.piece;
    return x.a != y.a ? x.a < y.a : x.b < y.b;
  });
  for (size_t i = 0; i < n; ++i)
    if (types[i] == Unknown || types[i] == Control || types[i] == UserDefined)
      v.added.push_back({int32_t(i), types[i] != UserDefined});
  if (add_bos) v.bos = *bos;
  if (bos) v.bos_token = std::string(tokens[size_t(*bos)]);
  if (h.has("tokenizer.chat_template")) {
    const std::string_view t = h.get_string("tokenizer.chat_template");
    if (utf8_first_invalid(t) != std::string_view::npos) fail("{}: tokenizer.chat_template is not valid UTF-8", where);
    v.chat_template = std::string(t);
  }
  return Tokenizer::from_pieces(v, where + " (tokenizer.ggml.*)");
}

}  // namespace vlm::text
