#include "text/gguf_vocab.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <unordered_map>

#include "core/error.h"
#include "io/json.h"  // printable

namespace vlm::text {

namespace {

// llama.cpp's token types (llama-vocab.h LLAMA_TOKEN_TYPE_*).
enum TokenType : int32_t { Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      out += fmt::format("\\u{:04x}", u);
    } else {
      out += c;
    }
  }
  out += '"';
}

struct Merge {
  float score;
  int32_t piece, a, b;
};

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

  std::unordered_map<std::string_view, int32_t> id_of;
  id_of.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i].empty()) fail("{}: tokenizer.ggml.tokens[{}] is empty", where, i);
    if (utf8_first_invalid(tokens[i]) != std::string_view::npos)
      fail("{}: tokenizer.ggml.tokens[{}] is not valid UTF-8", where, i);
    if (types[i] < Normal || types[i] > Byte)
      fail("{}: tokenizer.ggml.token_type[{}] = {} is not a llama.cpp token type (1-6)", where, i, types[i]);
    if (!std::isfinite(scores[i])) fail("{}: tokenizer.ggml.scores[{}] is not finite", where, i);
    if (!id_of.emplace(tokens[i], int32_t(i)).second)
      fail("{}: tokenizer.ggml.tokens: '{}' appears twice (ids {} and {})", where, printable(tokens[i]),
           id_of[tokens[i]], i);
  }
  auto special_id = [&](const char* key) -> std::optional<int32_t> {
    if (!h.has(key)) return std::nullopt;
    const uint64_t id = h.get_uint(key);
    if (id >= n) fail("{}: {} = {} is not below the vocabulary size {}", where, key, id, n);
    return int32_t(id);
  };
  const auto bos = special_id("tokenizer.ggml.bos_token_id");
  const auto eos = special_id("tokenizer.ggml.eos_token_id");
  const auto unk = special_id("tokenizer.ggml.unknown_token_id");
  const bool add_bos = h.get_bool_or("tokenizer.ggml.add_bos_token", true);
  if (add_bos && !bos) fail("{}: tokenizer.ggml.add_bos_token is set but tokenizer.ggml.bos_token_id is missing", where);

  // Every split of a normal or user-defined piece into two pieces, in score order.
  std::vector<Merge> merges;
  for (size_t i = 0; i < n; ++i) {
    if (types[i] != Normal && types[i] != UserDefined) continue;
    const std::string_view p = tokens[i];
    for (size_t k = utf8_sequence_length(p, 0); k < p.size(); k += utf8_sequence_length(p, k)) {
      auto a = id_of.find(p.substr(0, k)), b = id_of.find(p.substr(k));
      if (a != id_of.end() && b != id_of.end()) merges.push_back({scores[i], int32_t(i), a->second, b->second});
    }
  }
  std::sort(merges.begin(), merges.end(), [](const Merge& x, const Merge& y) {
    if (x.score != y.score) return x.score > y.score;
    if (x.piece != y.piece) return x.piece < y.piece;
    return x.a != y.a ? x.a < y.a : x.b < y.b;
  });

  // The equivalent tokenizer.json: Gemma's normalizer, pre-tokenizer, post-processor and decoder.
  std::string js;
  js.reserve(n * 24 + merges.size() * 24);
  js += R"({"version":"1.0","added_tokens":[)";
  bool first = true;
  for (size_t i = 0; i < n; ++i) {
    if (types[i] != Unknown && types[i] != Control && types[i] != UserDefined) continue;
    if (!first) js += ',';
    first = false;
    js += fmt::format(R"({{"id":{},"content":)", i);
    append_json_string(js, tokens[i]);
    js += fmt::format(R"(,"single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":{}}})",
                      types[i] == UserDefined ? "false" : "true");
  }
  js += R"(],"normalizer":{"type":"Replace","pattern":{"String":" "},"content":"▁"},)";
  js += R"("pre_tokenizer":{"type":"Split","pattern":{"String":" "},"behavior":"MergedWithPrevious","invert":false},)";
  if (add_bos) {
    js += R"("post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":)";
    append_json_string(js, tokens[size_t(*bos)]);
    js += R"(,"type_id":0}},{"Sequence":{"id":"A","type_id":0}}],"pair":[],"special_tokens":{)";
    append_json_string(js, tokens[size_t(*bos)]);
    js += R"(:{"id":)";
    append_json_string(js, tokens[size_t(*bos)]);
    js += fmt::format(R"(,"ids":[{}],"tokens":[)", *bos);
    append_json_string(js, tokens[size_t(*bos)]);
    js += "]}}},";
  }
  js += R"("decoder":{"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},"content":" "},)"
        R"({"type":"ByteFallback"},{"type":"Fuse"}]},)";
  js += R"("model":{"type":"BPE","dropout":null,"unk_token":)";
  if (unk)
    append_json_string(js, tokens[size_t(*unk)]);
  else
    js += "null";
  js += R"(,"continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":true,"byte_fallback":true,)"
        R"("ignore_merges":false,"vocab":{)";
  for (size_t i = 0; i < n; ++i) {
    if (i) js += ',';
    append_json_string(js, tokens[i]);
    js += fmt::format(":{}", i);
  }
  js += R"(},"merges":[)";
  for (size_t i = 0; i < merges.size(); ++i) {
    if (i) js += ',';
    js += '[';
    append_json_string(js, tokens[size_t(merges[i].a)]);
    js += ',';
    append_json_string(js, tokens[size_t(merges[i].b)]);
    js += ']';
  }
  js += "]}}";

  std::string cfg = "{";
  cfg += fmt::format(R"("add_bos_token":{},"add_eos_token":{})", add_bos ? "true" : "false",
                     h.get_bool_or("tokenizer.ggml.add_eos_token", false) ? "true" : "false");
  if (bos) {
    cfg += R"(,"bos_token":)";
    append_json_string(cfg, tokens[size_t(*bos)]);
  }
  if (eos) {
    cfg += R"(,"eos_token":)";
    append_json_string(cfg, tokens[size_t(*eos)]);
  }
  if (h.has("tokenizer.chat_template")) {
    const std::string_view t = h.get_string("tokenizer.chat_template");
    if (utf8_first_invalid(t) != std::string_view::npos) fail("{}: tokenizer.chat_template is not valid UTF-8", where);
    cfg += R"(,"chat_template":)";
    append_json_string(cfg, t);
  }
  cfg += "}";
  return Tokenizer::from_json(js, cfg, where + " (tokenizer.ggml.*)");
}

}  // namespace vlm::text
