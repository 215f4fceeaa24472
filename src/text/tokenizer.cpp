#include "text/tokenizer.h"

#include <simdjson.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <queue>
#include <unordered_map>

#include "core/error.h"
#include "io/file.h"

namespace vlm::text {

size_t utf8_sequence_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const size_t n = s.size();
  const unsigned c = b(i);
  if (c < 0x80) return 1;
  const auto cont = [&](size_t k) { return k < n && (b(k) & 0xC0) == 0x80; };
  if (c >= 0xC2 && c <= 0xDF) return cont(i + 1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(i + 1) || !cont(i + 2)) return 0;
    if (c == 0xE0 && b(i + 1) < 0xA0) return 0;  // overlong
    if (c == 0xED && b(i + 1) >= 0xA0) return 0;  // UTF-16 surrogate
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(i + 1) || !cont(i + 2) || !cont(i + 3)) return 0;
    if (c == 0xF0 && b(i + 1) < 0x90) return 0;  // overlong
    if (c == 0xF4 && b(i + 1) >= 0x90) return 0;  // above U+10FFFF
    return 4;
  }
  return 0;
}

size_t utf8_first_invalid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_sequence_length(s, i);
    if (len == 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

namespace {

namespace dom = simdjson::dom;

// Open-addressing hash tables: the stock unordered_map makes loading the
// 262k-entry vocab and 515k merges several times slower.
class TokenMap {
 public:
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    slots_.assign(cap, Slot{});
  }
  // Returns false when the key is already present.
  bool insert(std::string_view key, int32_t id) {
    const size_t h = std::hash<std::string_view>{}(key);
    for (size_t i = h & (slots_.size() - 1);; i = (i + 1) & (slots_.size() - 1)) {
      Slot& s = slots_[i];
      if (s.id < 0) {
        s = {key, id, uint32_t(h)};
        return true;
      }
      if (s.hash == uint32_t(h) && s.key == key) return false;
    }
  }
  int32_t find(std::string_view key) const {
    const size_t h = std::hash<std::string_view>{}(key);
    for (size_t i = h & (slots_.size() - 1);; i = (i + 1) & (slots_.size() - 1)) {
      const Slot& s = slots_[i];
      if (s.id < 0) return -1;
      if (s.hash == uint32_t(h) && s.key == key) return s.id;
    }
  }

 private:
  struct Slot {
    std::string_view key;  // points into the tokenizer's arena
    int32_t id = -1;
    uint32_t hash = 0;  // fits in the padding; skips most arena reads on collisions
  };
  std::vector<Slot> slots_;
};

struct Merge {
  uint32_t rank;
  int32_t result;
};

class MergeMap {
 public:
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    slots_.assign(cap, Slot{});
  }
  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  // Keeps the first (lowest-rank) entry of a repeated pair, as HF does.
  void insert(int32_t a, int32_t b, Merge m) {
    const uint64_t k = key(a, b);
    for (size_t i = hash(k);; i = (i + 1) & (slots_.size() - 1)) {
      if (slots_[i].merge.result < 0) {
        slots_[i] = {k, m};
        return;
      }
      if (slots_[i].key == k) return;
    }
  }
  const Merge* find(int32_t a, int32_t b) const {
    const uint64_t k = key(a, b);
    for (size_t i = hash(k);; i = (i + 1) & (slots_.size() - 1)) {
      if (slots_[i].merge.result < 0) return nullptr;
      if (slots_[i].key == k) return &slots_[i].merge;
    }
  }

 private:
  size_t hash(uint64_t k) const { return (k * 0x9E3779B97F4A7C15ull >> 20) & (slots_.size() - 1); }
  struct Slot {
    uint64_t key = 0;
    Merge merge{0, -1};
  };
  std::vector<Slot> slots_;
};

// Single-character vocab tokens keyed by their packed UTF-8 bytes: the first
// BPE step looks up every character, and this table stays in cache where the
// full vocab map does not.
class CharMap {
 public:
  static uint32_t key(std::string_view c) {
    uint32_t k = 0;
    for (unsigned char b : c) k = k << 8 | b;
    return k;
  }
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    slots_.assign(cap, Slot{});
  }
  void insert(uint32_t k, int32_t id) {
    for (size_t i = hash(k);; i = (i + 1) & (slots_.size() - 1))
      if (slots_[i].id < 0 || slots_[i].key == k) {
        slots_[i] = {k, id};
        return;
      }
  }
  int32_t find(uint32_t k) const {
    for (size_t i = hash(k);; i = (i + 1) & (slots_.size() - 1)) {
      if (slots_[i].id < 0) return -1;
      if (slots_[i].key == k) return slots_[i].id;
    }
  }

 private:
  size_t hash(uint32_t k) const { return (uint64_t(k) * 0x9E3779B97F4A7C15ull >> 32) & (slots_.size() - 1); }
  struct Slot {
    uint32_t key = 0;
    int32_t id = -1;
  };
  std::vector<Slot> slots_;
};

// Byte trie over the added tokens' contents, for leftmost-longest matching.
class AddedTrie {
 public:
  AddedTrie() : nodes_(1) {}
  void insert(std::string_view s, int32_t id) {
    uint32_t n = 0;
    for (unsigned char c : s) {
      uint32_t next = child(n, c);
      if (next == 0) {
        next = uint32_t(nodes_.size());
        nodes_[n].kids.push_back({c, next});
        nodes_.emplace_back();
      }
      n = next;
    }
    nodes_[n].token = id;
  }
  // Longest token starting at text[i] that `accept` allows: {length, id} or {0, -1}.
  template <typename Accept>
  std::pair<size_t, int32_t> longest(std::string_view text, size_t i, Accept accept) const {
    std::pair<size_t, int32_t> best{0, -1};
    uint32_t n = 0;
    for (size_t j = i; j < text.size(); ++j) {
      n = child(n, static_cast<unsigned char>(text[j]));
      if (n == 0) break;
      const int32_t t = nodes_[n].token;
      if (t >= 0 && accept(t)) best = {j + 1 - i, t};
    }
    return best;
  }
  int32_t exact(std::string_view s) const {
    uint32_t n = 0;
    for (unsigned char c : s)
      if ((n = child(n, c)) == 0) return -1;
    return nodes_[n].token;
  }

 private:
  uint32_t child(uint32_t n, unsigned char c) const {
    for (const auto& [k, v] : nodes_[n].kids)
      if (k == c) return v;
    return 0;  // node 0 is the root, never a child
  }
  struct Node {
    std::vector<std::pair<unsigned char, uint32_t>> kids;
    int32_t token = -1;
  };
  std::vector<Node> nodes_;
};

struct Replace {
  std::string from, to;
};

void apply_replace(const Replace& r, std::string_view in, std::string& out) {
  size_t pos = 0;
  for (size_t hit; (hit = in.find(r.from, pos)) != std::string_view::npos; pos = hit + r.from.size()) {
    out.append(in, pos, hit - pos);
    out += r.to;
  }
  out.append(in, pos);
}

// --- simdjson DOM access with errors that name the field -----------------------

struct Json {
  const std::string& where;  // file name for errors

  dom::element at(dom::element obj, const char* key, const std::string& path) const {
    dom::element v;
    if (obj.type() != dom::element_type::OBJECT) fail("{}: {} is not an object", where, path);
    if (obj.at_key(key).get(v)) fail("{}: missing field {}{}{}", where, path, path.empty() ? "" : ".", key);
    return v;
  }
  std::string_view str(dom::element e, const std::string& path) const {
    std::string_view s;
    if (e.get_string().get(s)) fail("{}: {} must be a string", where, path);
    return s;
  }
  int64_t integer(dom::element e, const std::string& path) const {
    int64_t v;
    if (e.get_int64().get(v)) fail("{}: {} must be an integer", where, path);
    return v;
  }
  bool boolean(dom::element e, const std::string& path) const {
    bool v;
    if (e.get_bool().get(v)) fail("{}: {} must be true or false", where, path);
    return v;
  }
  dom::array array(dom::element e, const std::string& path) const {
    dom::array a;
    if (e.get_array().get(a)) fail("{}: {} must be an array", where, path);
    return a;
  }
  // Optional key: nullopt when missing or null.
  std::optional<dom::element> opt(dom::element obj, const char* key) const {
    dom::element v;
    if (obj.type() != dom::element_type::OBJECT || obj.at_key(key).get(v) || v.is_null()) return std::nullopt;
    return v;
  }
  std::string type(dom::element obj, const std::string& path) const {
    return std::string(str(at(obj, "type", path), path + ".type"));
  }
  // {"String": "x"} patterns only; Regex patterns are not supported.
  std::string string_pattern(dom::element obj, const std::string& path) const {
    dom::element p = at(obj, "pattern", path);
    dom::element s;
    if (p.at_key("String").get(s)) fail("{}: {}.pattern: only String patterns are supported", where, path);
    return std::string(str(s, path + ".pattern.String"));
  }
};

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

struct Tokenizer::Impl {
  std::string where;
  // Token strings: id i is arena[off[i], off[i+1]).
  std::string arena;
  std::vector<uint32_t> off;
  TokenMap vocab;  // BPE model vocab only (added-only tokens are not BPE symbols)
  CharMap chars;   // the vocab's single-character tokens
  MergeMap merges;
  AddedTrie added;
  std::vector<uint8_t> special;  // per id
  std::vector<int16_t> byte_of;  // per id: 0..255 for <0xNN>, else -1
  int32_t byte_id[256];
  std::vector<Replace> normalizer;       // applied in order to text between added tokens
  std::string split_pattern;             // pre-tokenizer Split (MergedWithPrevious); empty = none
  std::vector<Replace> decode_replace;   // decoder Replace steps, per token
  std::vector<int32_t> prefix, suffix;   // post-processor single template
  std::string chat_template, bos_token;

  std::string_view tok(int32_t id) const { return {arena.data() + off[id], off[id + 1] - off[id]}; }

  void bpe(std::string_view word, std::vector<int32_t>& out) const;
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const;
};

namespace {

struct AddedToken {
  std::string_view content;
  int32_t id;
  bool special;
};

// The token strings (by_id covers ids 0..n-1), the BPE vocabulary (the ids in `vocab`), its
// single-character tokens, the added tokens and the byte-fallback tokens.
void init_vocab(Tokenizer::Impl& t, std::span<const std::string_view> by_id, std::span<const int32_t> vocab,
                std::span<const AddedToken> added) {
  const int32_t n = int32_t(by_id.size());
  size_t total = 0;
  for (auto s : by_id) total += s.size();
  if (total >= (size_t(1) << 32)) fail("{}: the token strings take {} bytes", t.where, total);
  t.arena.reserve(total);
  t.off.resize(size_t(n) + 1);
  for (int32_t i = 0; i < n; ++i) {
    t.off[i] = uint32_t(t.arena.size());
    t.arena += by_id[i];
  }
  t.off[n] = uint32_t(t.arena.size());

  t.vocab.reserve(vocab.size());
  for (int32_t id : vocab)
    if (!t.vocab.insert(t.tok(id), id)) fail("{}: model.vocab: token '{}' listed twice", t.where, t.tok(id));
  auto single_char = [](std::string_view s) { return !s.empty() && utf8_sequence_length(s, 0) == s.size(); };
  size_t n_chars = 0;
  for (int32_t id : vocab) n_chars += single_char(t.tok(id));
  t.chars.reserve(n_chars);
  for (int32_t id : vocab)
    if (single_char(t.tok(id))) t.chars.insert(CharMap::key(t.tok(id)), id);
  t.special.assign(size_t(n), 0);
  for (const AddedToken& a : added) {
    t.added.insert(a.content, a.id);
    t.special[a.id] = a.special;
  }
  t.byte_of.assign(size_t(n), -1);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    t.byte_id[b] = t.vocab.find(name);
    if (t.byte_id[b] < 0) fail("{}: byte-fallback token {} missing from model.vocab", t.where, name);
    t.byte_of[t.byte_id[b]] = int16_t(b);
  }
}

void parse_tokenizer_json(Tokenizer::Impl& t, std::string_view text) {
  const Json J{t.where};
  dom::parser parser;
  simdjson::padded_string padded(text);
  dom::element root;
  if (auto err = parser.parse(padded).get(root)) fail("{}: malformed JSON: {}", t.where, simdjson::error_message(err));
  if (root.type() != dom::element_type::OBJECT) fail("{}: top level is not an object", t.where);

  // Model.
  dom::element model = J.at(root, "model", "");
  if (std::string ty = J.type(model, "model"); ty != "BPE") fail("{}: model.type {} is not supported (BPE only)", t.where, ty);
  if (auto e = J.opt(model, "byte_fallback"); !e || !J.boolean(*e, "model.byte_fallback"))
    fail("{}: model.byte_fallback must be true (only byte-fallback BPE is supported)", t.where);
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix", "dropout"})
    if (J.opt(model, k)) fail("{}: model.{} is not supported", t.where, k);
  if (auto e = J.opt(model, "ignore_merges"); e && J.boolean(*e, "model.ignore_merges"))
    fail("{}: model.ignore_merges true is not supported", t.where);

  dom::object vocab;
  if (J.at(model, "vocab", "model").get_object().get(vocab)) fail("{}: model.vocab must be an object", t.where);
  dom::array added_tokens = J.array(J.at(root, "added_tokens", ""), "added_tokens");

  // Ids: vocab and added tokens together must cover 0..n-1 exactly once each.
  struct Entry {
    std::string_view s;
    int32_t id;
  };
  std::vector<Entry> entries;
  entries.reserve(vocab.size() + added_tokens.size());
  int64_t max_id = -1;
  for (auto [key, value] : vocab) {
    const int64_t id = J.integer(value, "model.vocab entry");
    if (id < 0 || id >= (1 << 24)) fail("{}: model.vocab: id {} out of range", t.where, id);
    entries.push_back({key, int32_t(id)});
    max_id = std::max(max_id, id);
  }
  const size_t n_vocab_entries = entries.size();
  std::vector<AddedToken> added;
  for (dom::element a : added_tokens) {
    const std::string path = "added_tokens[" + std::to_string(added.size()) + "]";
    const int64_t id = J.integer(J.at(a, "id", path), path + ".id");
    if (id < 0 || id >= (1 << 24)) fail("{}: {}.id {} out of range", t.where, path, id);
    std::string_view content = J.str(J.at(a, "content", path), path + ".content");
    if (content.empty()) fail("{}: {}.content is empty", t.where, path);
    for (const char* k : {"lstrip", "rstrip", "single_word", "normalized"})
      if (J.boolean(J.at(a, k, path), path + "." + k))
        fail("{}: {} ('{}') sets {}, which is not supported", t.where, path, content, k);
    added.push_back({content, int32_t(id), J.boolean(J.at(a, "special", path), path + ".special")});
    max_id = std::max(max_id, id);
  }
  const int32_t n = int32_t(max_id + 1);
  std::vector<std::string_view> by_id(n);
  std::vector<uint8_t> seen(n, 0);
  for (const Entry& e : entries) {
    if (seen[e.id]) fail("{}: model.vocab: id {} used twice", t.where, e.id);
    seen[e.id] = 1;
    by_id[e.id] = e.s;
  }
  for (const AddedToken& a : added) {
    if (seen[a.id] && by_id[a.id] != a.content)
      fail("{}: added token '{}' has id {}, which the vocab gives to '{}'", t.where, a.content, a.id, by_id[a.id]);
    seen[a.id] = 1;
    by_id[a.id] = a.content;
  }
  for (int32_t i = 0; i < n; ++i)
    if (!seen[i]) fail("{}: no token has id {}", t.where, i);

  std::vector<int32_t> vocab_ids(n_vocab_entries);
  for (size_t i = 0; i < n_vocab_entries; ++i) vocab_ids[i] = entries[i].id;
  init_vocab(t, by_id, vocab_ids, added);

  // Merges: ["a", "b"] pairs (current format) or "a b" strings (older format).
  dom::array merges = J.array(J.at(model, "merges", "model"), "model.merges");
  t.merges.reserve(merges.size());
  uint32_t rank = 0;
  std::string joined;
  for (dom::element m : merges) {
    std::string_view a, b;
    if (m.type() == dom::element_type::ARRAY) {
      dom::array pair = m.get_array();
      if (pair.size() != 2 || pair.at(0).get_string().get(a) || pair.at(1).get_string().get(b))
        fail("{}: model.merges[{}] must be a pair of strings", t.where, rank);
    } else {
      std::string_view s;
      if (m.get_string().get(s) || s.find(' ') == std::string_view::npos)
        fail("{}: model.merges[{}] must be a pair of strings or \"a b\"", t.where, rank);
      a = s.substr(0, s.find(' '));
      b = s.substr(s.find(' ') + 1);
    }
    const int32_t ia = t.vocab.find(a), ib = t.vocab.find(b);
    joined.assign(a).append(b);
    const int32_t ir = t.vocab.find(joined);
    if (ia < 0 || ib < 0 || ir < 0)
      fail("{}: model.merges[{}] ('{}', '{}'): token '{}' not in model.vocab", t.where, rank, a, b,
           ia < 0 ? a : ib < 0 ? b : std::string_view(joined));
    t.merges.insert(ia, ib, {rank, ir});
    ++rank;
  }

  // Normalizer: null, Replace, or a Sequence of Replace.
  if (auto norm_opt = J.opt(root, "normalizer")) {
    dom::element norm = *norm_opt;
    auto add_replace = [&](dom::element e, const std::string& path) {
      if (std::string ty = J.type(e, path); ty != "Replace")
        fail("{}: {}.type {} is not supported (Replace only)", t.where, path, ty);
      t.normalizer.push_back({J.string_pattern(e, path), std::string(J.str(J.at(e, "content", path), path + ".content"))});
      if (t.normalizer.back().from.empty()) fail("{}: {}.pattern is empty", t.where, path);
    };
    if (J.type(norm, "normalizer") == "Sequence") {
      size_t i = 0;
      for (dom::element e : J.array(J.at(norm, "normalizers", "normalizer"), "normalizer.normalizers"))
        add_replace(e, "normalizer.normalizers[" + std::to_string(i++) + "]");
    } else {
      add_replace(norm, "normalizer");
    }
  }

  // Pre-tokenizer: null or Split(String, MergedWithPrevious, invert false).
  if (auto pre_opt = J.opt(root, "pre_tokenizer")) {
    dom::element pre = *pre_opt;
    if (std::string ty = J.type(pre, "pre_tokenizer"); ty != "Split")
      fail("{}: pre_tokenizer.type {} is not supported (Split only)", t.where, ty);
    if (std::string_view beh = J.str(J.at(pre, "behavior", "pre_tokenizer"), "pre_tokenizer.behavior");
        beh != "MergedWithPrevious")
      fail("{}: pre_tokenizer.behavior {} is not supported (MergedWithPrevious only)", t.where, beh);
    if (J.boolean(J.at(pre, "invert", "pre_tokenizer"), "pre_tokenizer.invert"))
      fail("{}: pre_tokenizer.invert true is not supported", t.where);
    t.split_pattern = J.string_pattern(pre, "pre_tokenizer");
    if (t.split_pattern.empty()) fail("{}: pre_tokenizer.pattern is empty", t.where);
  }

  // Post-processor: null or TemplateProcessing; only the `single` template is used.
  if (auto post_opt = J.opt(root, "post_processor")) {
    dom::element post = *post_opt;
    if (std::string ty = J.type(post, "post_processor"); ty != "TemplateProcessing")
      fail("{}: post_processor.type {} is not supported (TemplateProcessing only)", t.where, ty);
    dom::element specials = J.at(post, "special_tokens", "post_processor");
    bool after_sequence = false;
    size_t i = 0;
    for (dom::element piece : J.array(J.at(post, "single", "post_processor"), "post_processor.single")) {
      const std::string path = "post_processor.single[" + std::to_string(i++) + "]";
      auto st = J.opt(piece, "SpecialToken");
      if (!st) {
        if (!J.opt(piece, "Sequence")) fail("{}: {} is neither SpecialToken nor Sequence", t.where, path);
        after_sequence = true;
        continue;
      }
      std::string_view name = J.str(J.at(*st, "id", path + ".SpecialToken"), path + ".SpecialToken.id");
      dom::element def;
      if (specials.at_key(name).get(def)) fail("{}: {} names '{}', missing from post_processor.special_tokens", t.where, path, name);
      for (dom::element id : J.array(J.at(def, "ids", "post_processor.special_tokens"), "post_processor.special_tokens.ids")) {
        const int64_t v = J.integer(id, "post_processor.special_tokens.ids[]");
        if (v < 0 || v >= n) fail("{}: post_processor.special_tokens '{}': id {} out of range", t.where, name, v);
        (after_sequence ? t.suffix : t.prefix).push_back(int32_t(v));
      }
    }
  }

  // Decoder: Sequence of Replace steps, then ByteFallback, then Fuse.
  {
    const char* expected = "Sequence [Replace..., ByteFallback, Fuse]";
    auto dec_opt = J.opt(root, "decoder");
    if (!dec_opt || J.type(*dec_opt, "decoder") != "Sequence") fail("{}: decoder must be {}", t.where, expected);
    dom::element dec = *dec_opt;
    std::vector<std::string> steps;
    size_t i = 0;
    for (dom::element d : J.array(J.at(dec, "decoders", "decoder"), "decoder.decoders")) {
      const std::string path = "decoder.decoders[" + std::to_string(i++) + "]";
      steps.push_back(J.type(d, path));
      if (steps.back() == "Replace") {
        if (steps.size() != t.decode_replace.size() + 1) fail("{}: decoder must be {}", t.where, expected);
        t.decode_replace.push_back({J.string_pattern(d, path), std::string(J.str(J.at(d, "content", path), path + ".content"))});
        if (t.decode_replace.back().from.empty()) fail("{}: {}.pattern is empty", t.where, path);
      }
    }
    const size_t k = t.decode_replace.size();
    if (steps.size() != k + 2 || steps[k] != "ByteFallback" || steps[k + 1] != "Fuse")
      fail("{}: decoder must be {}", t.where, expected);
  }
}

void parse_tokenizer_config(Tokenizer::Impl& t, std::string_view text, const std::string& where) {
  const Json J{where};
  dom::parser parser;
  simdjson::padded_string padded(text);
  dom::element root;
  if (auto err = parser.parse(padded).get(root)) fail("{}: malformed JSON: {}", where, simdjson::error_message(err));
  if (root.type() != dom::element_type::OBJECT) fail("{}: top level is not an object", where);
  // chat_template: a string, or a list of {name, template} where "default" is used.
  if (auto ct_opt = J.opt(root, "chat_template")) {
    dom::element ct = *ct_opt;
    if (ct.type() == dom::element_type::STRING) {
      t.chat_template = std::string(J.str(ct, "chat_template"));
    } else {
      for (dom::element e : J.array(ct, "chat_template"))
        if (J.str(J.at(e, "name", "chat_template[]"), "chat_template[].name") == "default")
          t.chat_template = std::string(J.str(J.at(e, "template", "chat_template[]"), "chat_template[].template"));
    }
  }
  // bos_token: a string or an AddedToken object {"content": ...}.
  if (auto bos_opt = J.opt(root, "bos_token")) {
    dom::element bos = *bos_opt;
    t.bos_token = std::string(bos.type() == dom::element_type::STRING
                                  ? J.str(bos, "bos_token")
                                  : J.str(J.at(bos, "content", "bos_token"), "bos_token.content"));
  }
}

std::string read_file(const std::filesystem::path& p) {
  std::error_code ec;
  if (!std::filesystem::exists(p, ec)) fail("{}: file not found", p.string());
  return read_text_file(p);
}

}  // namespace

void Tokenizer::Impl::bpe(std::string_view word, std::vector<int32_t>& out) const {
  struct Sym {
    int32_t id, prev, next;
  };
  std::vector<Sym> syms;
  syms.reserve(word.size());
  for (size_t i = 0; i < word.size();) {
    const size_t len = utf8_sequence_length(word, i);  // input was validated
    const int32_t id = chars.find(CharMap::key(word.substr(i, len)));
    if (id >= 0) {
      syms.push_back({id, int32_t(syms.size()) - 1, int32_t(syms.size()) + 1});
    } else {
      for (size_t k = 0; k < len; ++k)
        syms.push_back({byte_id[static_cast<unsigned char>(word[i + k])], int32_t(syms.size()) - 1,
                        int32_t(syms.size()) + 1});
    }
    i += len;
  }
  if (syms.empty()) return;
  syms.back().next = -1;

  // Lowest rank first, then leftmost: the order HF applies merges in.
  struct Cand {
    uint32_t rank;
    int32_t pos, left, right;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<>> queue;
  auto push = [&](int32_t pos) {
    const int32_t nx = syms[pos].next;
    if (nx < 0) return;
    if (const Merge* m = merges.find(syms[pos].id, syms[nx].id)) queue.push({m->rank, pos, syms[pos].id, syms[nx].id});
  };
  for (int32_t i = 0; i + 1 < int32_t(syms.size()); ++i) push(i);
  while (!queue.empty()) {
    const Cand c = queue.top();
    queue.pop();
    Sym& s = syms[c.pos];
    // Stale entries: either side has been merged away or changed since.
    if (s.id != c.left || s.next < 0 || syms[s.next].id != c.right) continue;
    const Sym gone = syms[s.next];
    s.id = merges.find(c.left, c.right)->result;
    syms[s.next].id = -1;
    s.next = gone.next;
    if (gone.next >= 0) syms[gone.next].prev = c.pos;
    if (s.prev >= 0) push(s.prev);
    push(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
}

void Tokenizer::Impl::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string norm(text), tmp;
  for (const Replace& r : normalizer) {
    tmp.clear();
    apply_replace(r, norm, tmp);
    norm.swap(tmp);
  }
  std::string_view s = norm;
  if (split_pattern.empty()) return bpe(s, out);
  // Split with MergedWithPrevious: each occurrence of the pattern ends a piece.
  size_t start = 0;
  for (size_t hit; (hit = s.find(split_pattern, start)) != std::string_view::npos;) {
    const size_t end = hit + split_pattern.size();
    bpe(s.substr(start, end - start), out);
    start = end;
  }
  if (start < s.size()) bpe(s.substr(start), out);
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, std::string_view config_json, const std::string& where) {
  auto impl = std::make_unique<Impl>();
  impl->where = where + "/tokenizer.json";
  parse_tokenizer_json(*impl, tokenizer_json);
  parse_tokenizer_config(*impl, config_json, where + "/tokenizer_config.json");
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_pieces(const PieceVocab& v, const std::string& where) {
  auto impl = std::make_unique<Impl>();
  Impl& t = *impl;
  t.where = where;
  const int32_t n = int32_t(v.pieces.size());
  if (v.pieces.size() >= (size_t(1) << 24)) fail("{}: {} pieces", where, v.pieces.size());
  auto check = [&](int32_t id, const char* what) {
    if (id < 0 || id >= n) fail("{}: {} id {} is not below the vocabulary size {}", where, what, id, n);
  };
  std::vector<int32_t> vocab(v.pieces.size());
  std::iota(vocab.begin(), vocab.end(), 0);
  std::vector<AddedToken> added;
  added.reserve(v.added.size());
  for (const PieceVocab::Added& a : v.added) {
    check(a.id, "added token");
    added.push_back({v.pieces[size_t(a.id)], a.id, a.special});
  }
  init_vocab(t, v.pieces, vocab, added);
  t.merges.reserve(v.merges.size());
  for (size_t r = 0; r < v.merges.size(); ++r) {
    const PieceVocab::Merge& m = v.merges[r];
    check(m.a, "merge"), check(m.b, "merge"), check(m.piece, "merge");
    if (t.tok(m.piece).size() != t.tok(m.a).size() + t.tok(m.b).size() || !t.tok(m.piece).starts_with(t.tok(m.a)) ||
        !t.tok(m.piece).ends_with(t.tok(m.b)))
      fail("{}: merge {}: '{}' + '{}' is not '{}'", where, r, t.tok(m.a), t.tok(m.b), t.tok(m.piece));
    t.merges.insert(m.a, m.b, {uint32_t(r), m.piece});
  }
  constexpr const char* kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space
  t.normalizer.push_back({" ", kSpace});
  t.split_pattern = " ";
  if (v.bos) {
    check(*v.bos, "bos");
    t.prefix.push_back(*v.bos);
  }
  t.decode_replace.push_back({kSpace, " "});
  t.chat_template = v.chat_template;
  t.bos_token = v.bos_token;
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::load(const std::filesystem::path& dir) {
  const std::string tj = read_file(dir / "tokenizer.json");
  const std::string cj = read_file(dir / "tokenizer_config.json");
  return from_json(tj, cj, dir.string());
}

void Tokenizer::encode_append(std::string_view text, bool parse_special, std::vector<int32_t>& out) const {
  const Impl& t = *impl_;
  if (size_t bad = utf8_first_invalid(text); bad != std::string_view::npos)
    fail("invalid UTF-8 in input text at byte {} (0x{:02X}); the tokenizer refuses invalid UTF-8", bad,
         static_cast<unsigned char>(text[bad]));
  auto accept = [&](int32_t id) { return parse_special || !t.special[id]; };
  size_t start = 0;
  for (size_t i = 0; i < text.size();) {
    const auto [len, id] = t.added.longest(text, i, accept);
    if (len == 0) {
      ++i;  // added tokens are valid UTF-8, so they never match inside a character
      continue;
    }
    t.encode_plain(text.substr(start, i - start), out);
    out.push_back(id);
    i += len;
    start = i;
  }
  t.encode_plain(text.substr(start), out);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, const EncodeOptions& opt) const {
  std::vector<int32_t> ids;
  if (opt.add_special) ids = impl_->prefix;
  encode_append(text, opt.parse_special, ids);
  if (opt.add_special) ids.insert(ids.end(), impl_->suffix.begin(), impl_->suffix.end());
  return ids;
}

void Tokenizer::check_id(int32_t id) const {
  if (id < 0 || id >= vocab_size()) fail("token id {} out of range [0, {})", id, vocab_size());
}

void Tokenizer::append_piece(int32_t id, std::string& out) const {
  std::string_view s = impl_->tok(id);
  if (impl_->decode_replace.empty()) {
    out += s;
    return;
  }
  std::string cur(s), tmp;
  for (const Replace& r : impl_->decode_replace) {
    tmp.clear();
    apply_replace(r, cur, tmp);
    cur.swap(tmp);
  }
  out += cur;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, const DecodeOptions& opt) const {
  std::string out, bytes;
  size_t n_byte_tokens = 0;
  auto flush = [&] {
    if (utf8_first_invalid(bytes) == std::string_view::npos) {
      out += bytes;
    } else {
      for (size_t i = 0; i < n_byte_tokens; ++i) out += kReplacementChar;
    }
    bytes.clear();
    n_byte_tokens = 0;
  };
  for (int32_t id : ids) {
    check_id(id);
    if (opt.skip_special && impl_->special[id]) continue;
    if (const int b = impl_->byte_of[id]; b >= 0) {
      bytes.push_back(char(b));
      ++n_byte_tokens;
      continue;
    }
    flush();
    append_piece(id, out);
  }
  flush();
  return out;
}

int32_t Tokenizer::vocab_size() const { return int32_t(impl_->off.size() - 1); }

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  if (int32_t id = impl_->added.exact(token); id >= 0) return id;
  if (int32_t id = impl_->vocab.find(token); id >= 0) return id;
  return std::nullopt;
}

std::string_view Tokenizer::token(int32_t id) const {
  check_id(id);
  return impl_->tok(id);
}

bool Tokenizer::is_special(int32_t id) const {
  check_id(id);
  return impl_->special[id];
}

int Tokenizer::byte_value(int32_t id) const {
  check_id(id);
  return impl_->byte_of[id];
}

const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }
const std::string& Tokenizer::bos_token() const { return impl_->bos_token; }

}  // namespace vlm::text
