#include "server/tools.h"

#include <fmt/format.h>

#include <charconv>
#include <optional>
#include <random>

#include "text/tokenizer.h"

namespace vlm::server {

namespace {

using json = Json;

// A reference inside a function's parameters ("#/$defs/x") as seen from the answer's schema,
// where the parameters sit at /$defs/<def>: "#/$defs/<def>/$defs/x".
void move_refs(json& s, const std::string& def) {
  if (s.is_array()) {
    for (json& e : s) move_refs(e, def);
  } else if (s.is_object()) {
    for (auto& [key, value] : s.items())
      if (key == "$ref" && value.is_string() && value.get_ref<const std::string&>().rfind("#", 0) == 0)
        value = "#/$defs/" + def + value.get<std::string>().substr(1);
      else
        move_refs(value, def);
  }
}

// OpenAI's ids are "call_" and 24 letters or digits.
std::string call_id() {
  static constexpr char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{(uint64_t(std::random_device{}()) << 32) ^ std::random_device{}()};
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kChars[rng() % (sizeof(kChars) - 1)];
  return id;
}

json object_of(json properties) {
  json req = json::array();
  for (auto& [key, _] : properties.items()) req.push_back(key);
  return {{"type", "object"}, {"properties", std::move(properties)}, {"required", std::move(req)},
          {"additionalProperties", false}};
}

}  // namespace

ToolUse tool_use(const std::vector<Function>& functions, ToolChoice choice, const std::string& named, bool parallel) {
  json defs = json::object(), calls = json::array(), listed = json::array();
  for (size_t i = 0; i < functions.size(); ++i) {
    const Function& f = functions[i];
    json fn{{"name", f.name}};
    if (!f.description.empty()) fn["description"] = f.description;
    fn["parameters"] = f.parameters;
    listed.push_back(std::move(fn));
    if (choice == ToolChoice::Named && f.name != named) continue;
    const std::string def = fmt::format("vlm_tool_{}", i);
    json params = f.parameters;
    move_refs(params, def);
    defs[def] = std::move(params);
    calls.push_back(object_of({{"name", {{"const", f.name}}}, {"arguments", {{"$ref", "#/$defs/" + def}}}}));
  }
  json list{{"type", "array"}, {"items", calls.size() == 1 ? calls[0] : json{{"anyOf", calls}}}, {"minItems", 1}};
  if (!parallel) list["maxItems"] = 1;
  json root = object_of({{"tool_calls", std::move(list)}});
  if (choice == ToolChoice::Auto) root = {{"anyOf", {std::move(root), object_of({{"response", {{"type", "string"}}}})}}};
  root["$defs"] = std::move(defs);

  std::string text = "You can call these functions, given as JSON:\n";
  for (const json& fn : listed) text += dump(fn) + "\n";
  std::string call = R"({"tool_calls": [{"name": "<function name>", "arguments": {<its parameters>}}]})";
  if (!parallel) call += " (one call only)";
  if (choice == ToolChoice::Auto)
    text += "To call functions, answer with " + call + ". To answer without calling one, answer with "
            R"({"response": "<your answer>"}. Answer with that one JSON object and nothing else.)";
  else if (choice == ToolChoice::Required)
    text += "Answer by calling functions, with " + call + " and nothing else.";
  else
    text += "Answer by calling the function " + named + ", with " + call + " and nothing else.";
  return {grammar::Schema::compile(root), std::move(text)};
}

namespace {

constexpr size_t npos = std::string_view::npos;

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

size_t skip_spaces(std::string_view s, size_t p) {
  while (p < s.size() && is_space(s[p])) ++p;
  return p;
}

// Past the closing quote of the JSON string opening at s[p], or npos when the text ends first.
size_t string_end(std::string_view s, size_t p) {
  for (size_t q = p + 1; q < s.size(); ++q)
    if (s[q] == '\\') ++q;
    else if (s[q] == '"') return q + 1;
  return npos;
}

// The code unit of the \u escape at s[q], if its four hex digits are there.
std::optional<unsigned> escaped_unit(std::string_view s, size_t q) {
  unsigned v = 0;
  if (q + 6 > s.size() || s[q] != '\\' || s[q + 1] != 'u') return std::nullopt;
  const auto [end, ec] = std::from_chars(s.data() + q + 2, s.data() + q + 6, v, 16);
  if (ec != std::errc() || end != s.data() + q + 6) return std::nullopt;
  return v;
}

// The JSON string opening at s[p], decoded (by nlohmann's parser) into `out` as far as it goes
// by JSON's rules: whole UTF-8 characters and escapes (a high surrogate's with its low half),
// up to the text's end or the first thing JSON does not allow there. Returns string_end, or npos
// when it stops before its closing quote.
size_t read_string(std::string_view s, size_t p, std::string& out) {
  size_t q = p + 1;
  while (q < s.size() && s[q] != '"') {
    size_t len = 0;
    if (s[q] == '\\' && q + 1 < s.size() && s[q + 1] == 'u') {
      const std::optional<unsigned> u = escaped_unit(s, q);
      if (u && *u >= 0xD800 && *u < 0xDC00) {
        const std::optional<unsigned> low = escaped_unit(s, q + 6);
        if (low && *low >= 0xDC00 && *low < 0xE000) len = 12;
      } else if (u && (*u < 0xDC00 || *u >= 0xE000)) {
        len = 6;
      }
    } else if (s[q] == '\\') {
      if (q + 1 < s.size() && std::string_view("\"\\/bfnrt").find(s[q + 1]) != npos) len = 2;
    } else if (static_cast<unsigned char>(s[q]) >= 0x20) {
      len = text::utf8_sequence_length(s, q);
    }
    if (len == 0) break;
    q += len;
  }
  const json v = json::parse(std::string(s.substr(p, q - p)) + '"', nullptr, false);
  if (v.is_string()) out = v.get<std::string>();
  return q < s.size() && s[q] == '"' ? q + 1 : npos;
}

// The end of the JSON value at s[p], or npos when the text ends inside it (a number or literal is
// whole once something follows it).
size_t value_end(std::string_view s, size_t p) {
  if (p >= s.size()) return npos;
  if (s[p] == '"') return string_end(s, p);
  if (s[p] == '{' || s[p] == '[') {
    int depth = 0;
    for (size_t q = p; q < s.size();) {
      if (s[q] == '"') {
        if ((q = string_end(s, q)) == npos) return npos;
        continue;
      }
      if (s[q] == '{' || s[q] == '[') ++depth;
      else if ((s[q] == '}' || s[q] == ']') && --depth == 0) return q + 1;
      ++q;
    }
    return npos;
  }
  size_t q = p;
  while (q < s.size() && !is_space(s[q]) && s[q] != ',' && s[q] != '}' && s[q] != ']') ++q;
  return q < s.size() ? q : npos;
}

}  // namespace

ToolAnswerReader::Delta ToolAnswerReader::feed(std::string_view text) {
  text_ += text;
  parse();
  Delta d;
  if (content_.size() > content_sent_) {
    d.content = content_.substr(content_sent_);
    content_sent_ = content_.size();
  }
  for (size_t k = 0; k < calls_.size(); ++k) {
    const ToolCall& c = calls_[k];
    if (k == arguments_sent_.size()) {
      d.calls.push_back({k, c.id, c.name, c.arguments});
      arguments_sent_.push_back(c.arguments.size());
    } else if (c.arguments.size() > arguments_sent_[k]) {
      d.calls.push_back({k, {}, {}, c.arguments.substr(arguments_sent_[k])});
      arguments_sent_[k] = c.arguments.size();
    }
  }
  return d;
}

// The answer is {"response": "..."} or {"tool_calls": [{"name": ..., "arguments": ...}, ...]}
// with the spaces the grammar allows; parsing stops where the text ends (or where it is not that
// form, which the grammar never writes).
void ToolAnswerReader::parse() {
  const std::string_view s = text_;
  size_t p = skip_spaces(s, 0);
  if (p >= s.size() || s[p] != '{') return;
  p = skip_spaces(s, p + 1);
  std::string key;
  if (p >= s.size() || s[p] != '"' || (p = read_string(s, p, key)) == npos) return;
  p = skip_spaces(s, p);
  if (p >= s.size() || s[p] != ':') return;
  p = skip_spaces(s, p + 1);
  if (p >= s.size()) return;
  if (key == "response" && s[p] == '"') {
    response_ = true;
    p = read_string(s, p, content_);
  } else if (key == "tool_calls" && s[p] == '[') {
    p = parse_calls(s, p + 1);
  } else {
    return;
  }
  if (p == npos) return;
  p = skip_spaces(s, p);
  // Whole once it closes, if it is JSON (the grammar's always is).
  whole_ = p < s.size() && s[p] == '}' && json::accept(s.substr(0, p + 1));
}

size_t ToolAnswerReader::parse_calls(std::string_view s, size_t p) {
  size_t listed = 0;  // calls with a name so far: the next one's index
  for (size_t k = 0;; ++k) {
    p = skip_spaces(s, p);
    if (p < s.size() && s[p] == ']') return p + 1;
    if (k > 0) {
      if (p >= s.size() || s[p] != ',') return npos;
      p = skip_spaces(s, p + 1);
    }
    if (p >= s.size() || s[p] != '{') return npos;
    // Call k's members, in any order (a repeated one counts once); it is listed once its name is
    // whole (one without a name never is: the grammar always writes one).
    std::optional<std::string> name;
    std::optional<std::string_view> arguments;
    auto note = [&] {
      if (!name) return;
      if (calls_.size() == listed) calls_.push_back({call_id(), *name, {}});
      calls_[listed++].arguments = std::string(arguments.value_or(""));
    };
    p = skip_spaces(s, p + 1);
    for (size_t m = 0;; ++m) {
      if (p < s.size() && s[p] == '}') break;
      if (m > 0) {
        if (p >= s.size() || s[p] != ',') return note(), npos;
        p = skip_spaces(s, p + 1);
      }
      std::string member, value;
      if (p >= s.size() || s[p] != '"' || (p = read_string(s, p, member)) == npos) return note(), npos;
      p = skip_spaces(s, p);
      if (p >= s.size() || s[p] != ':') return note(), npos;
      p = skip_spaces(s, p + 1);
      if (p >= s.size()) return note(), npos;
      const size_t start = p;
      if (member == "name" && s[p] == '"') {
        if ((p = read_string(s, p, value)) == npos) return note(), npos;
        if (!name) name = std::move(value);
      } else {
        p = value_end(s, p);
        if (member == "arguments" && !arguments) arguments = s.substr(start, (p == npos ? s.size() : p) - start);
        if (p == npos) return note(), npos;
      }
      p = skip_spaces(s, p);
    }
    note();
    ++p;  // past the call's '}'
  }
}

void ToolAnswerReader::read(ChoiceOut& c) {
  feed(c.text);
  c.tool_calls = calls_;
  c.text = content_;
  if (called()) c.finish = "tool_calls";
}

void read_tool_answer(ChoiceOut& c) { ToolAnswerReader().read(c); }

std::string tool_calls_text(const std::vector<ToolCall>& calls) {
  json list = json::array();
  for (const ToolCall& c : calls) {
    json args = json::parse(c.arguments, nullptr, false);
    list.push_back({{"name", c.name}, {"arguments", args.is_discarded() ? json(c.arguments) : std::move(args)}});
  }
  return dump(json{{"tool_calls", std::move(list)}});
}

std::string tool_result_text(const std::string& name, const std::string& call_id, const std::string& content) {
  json r = json::object();
  if (!name.empty()) r["name"] = name;
  if (!call_id.empty()) r["tool_call_id"] = call_id;
  r["content"] = content;
  return dump(json{{"tool_response", std::move(r)}});
}

}  // namespace vlm::server
