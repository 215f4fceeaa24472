#include "grammar/schema.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "core/error.h"
#include "io/json.h"

namespace vlm::grammar {

using json = nlohmann::ordered_json;

namespace {

// Bounds on what a client's schema may cost the engine: each byte a literal frame takes scans its
// values, and every node is a frame kind to step through.
constexpr size_t kMaxValues = 1024;  // values of one enum (or of literal branches merged into one)
constexpr size_t kMaxNodes = 4096;

// Keywords that say nothing about which values match (JSON Schema 2020-12 §9, "meta-data").
const std::set<std::string, std::less<>> kAnnotations = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
    "readOnly", "writeOnly", "$defs", "definitions"};

// Keywords of one instance type; each applies only when the value has that type.
const std::set<std::string, std::less<>> kObjectWords = {"properties", "required", "additionalProperties"};
const std::set<std::string, std::less<>> kArrayWords = {"items", "minItems", "maxItems", "uniqueItems"};
const std::set<std::string, std::less<>> kStringWords = {"minLength", "maxLength"};
const std::set<std::string, std::less<>> kValueWords = {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref"};

std::string pointer_child(const std::string& at, std::string_view key) {
  std::string out = at + "/";
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

bool has(const json& s, std::string_view key) { return s.find(key) != s.end(); }

// The JSON type names a value has ("integer" values are also "number").
bool has_type(const json& v, std::string_view t) {
  if (t == "null") return v.is_null();
  if (t == "boolean") return v.is_boolean();
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  if (t == "number") return v.is_number();
  if (t == "integer") return v.is_number_integer() || (v.is_number_float() && std::trunc(v.get<double>()) == v.get<double>());
  return false;
}

}  // namespace

class Compiler {
 public:
  Compiler(Schema& out, const json& root) : out_(out), root_(root) {}

  const Node* compile(const json& s, const std::string& at) {
    if (s.is_boolean()) {
      if (s.get<bool>()) return out_.any();
      fail("schema {}: 'false' matches no value", at);
    }
    if (!s.is_object()) fail("schema {}: a schema must be an object or a boolean, got {}", at, s.type_name());
    for (const auto& [key, value] : s.items()) {
      if (kAnnotations.count(key) || kObjectWords.count(key) || kArrayWords.count(key) || kStringWords.count(key) ||
          kValueWords.count(key))
        continue;
      fail("schema {}: '{}' is not supported (docs/structured-output.md lists what is)", at, printable(key));
    }
    if (has(s, "$ref")) return reference(s, at);
    if (has(s, "allOf")) {
      const json& all = s["allOf"];
      if (!all.is_array() || all.size() != 1 || others(s, "allOf"))
        fail("schema {}: 'allOf' is supported with exactly one schema and nothing beside it", at);
      return compile(all[0], pointer_child(at, "allOf") + "/0");
    }
    for (const char* word : {"anyOf", "oneOf"}) {
      if (!has(s, word)) continue;
      const json& list = s[word];
      if (!list.is_array() || list.empty()) fail("schema {}: '{}' must be a non-empty array", at, word);
      if (others(s, word)) fail("schema {}: '{}' is supported with nothing beside it but annotations", at, word);
      std::vector<const Node*> options;
      for (size_t i = 0; i < list.size(); ++i)
        options.push_back(compile(list[i], pointer_child(at, word) + "/" + std::to_string(i)));
      return choice(std::move(options));
    }
    const std::vector<std::string> types = type_list(s, at);
    if (has(s, "const") || has(s, "enum")) return literals(s, types, at);
    if (types.empty()) {  // no type: what the type-specific keywords imply, else any value
      for (const auto& [key, value] : s.items())
        if (kObjectWords.count(key)) return object(s, at);
      for (const auto& [key, value] : s.items())
        if (kArrayWords.count(key)) return array(s, at);
      for (const auto& [key, value] : s.items())
        if (kStringWords.count(key)) return string(s, at);
      return out_.any();
    }
    std::vector<const Node*> options;
    for (const std::string& t : types) options.push_back(of_type(s, t, at));
    return choice(std::move(options));
  }

 private:
  // One of `options`: a single Literal node when they are all literals, else a Choice.
  const Node* choice(std::vector<const Node*> options) {
    if (options.size() == 1) return options[0];
    Node* n = out_.add();
    const bool literals = std::all_of(options.begin(), options.end(), [](const Node* o) { return o->kind == Node::Kind::Literal; });
    if (!literals) {
      n->options = std::move(options);
      return n;
    }
    n->kind = Node::Kind::Literal;
    for (const Node* o : options)
      for (const std::string& t : o->texts)
        if (std::find(n->texts.begin(), n->texts.end(), t) == n->texts.end()) n->texts.push_back(t);
    if (n->texts.size() > kMaxValues) fail("schema: more than {} values to choose among in one place", kMaxValues);
    return n;
  }

  // True when `s` has keywords other than `word` and annotations.
  static bool others(const json& s, std::string_view word) {
    for (const auto& [key, value] : s.items())
      if (key != word && !kAnnotations.count(key)) return true;
    return false;
  }

  const Node* reference(const json& s, const std::string& at) {
    if (others(s, "$ref")) fail("schema {}: '$ref' is supported with nothing beside it but annotations", at);
    const json& r = s["$ref"];
    if (!r.is_string() || r.get_ref<const std::string&>().rfind("#", 0) != 0)
      fail("schema {}: '$ref' must point into this schema ('#', '#/$defs/...')", at);
    const std::string ref = r.get<std::string>();
    if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
    const json* target = nullptr;
    try {
      target = &root_.at(json::json_pointer(ref.substr(1)));
    } catch (const json::exception&) {
      fail("schema {}: '$ref' '{}' points to nothing in the schema", at, printable(ref));
    }
    // A placeholder first, so that a recursive reference finds it; it becomes a one-way choice.
    Node* n = out_.add();
    refs_[ref] = n;
    const Node* body = compile(*target, ref);
    if (body == n) fail("schema {}: '$ref' '{}' refers only to itself", at, printable(ref));
    n->options.push_back(body);
    return n;
  }

  static std::vector<std::string> type_list(const json& s, const std::string& at) {
    static const std::set<std::string, std::less<>> known = {"object", "array", "string", "number",
                                                             "integer", "boolean", "null"};
    std::vector<std::string> out;
    auto it = s.find("type");
    if (it == s.end()) return out;
    const auto add = [&](const json& t) {
      if (!t.is_string() || !known.count(t.get_ref<const std::string&>()))
        fail("schema {}/type: '{}' is not a JSON Schema type", at, printable(t.dump()));
      out.push_back(t.get<std::string>());
    };
    if (it->is_array()) {
      if (it->empty()) fail("schema {}/type: an empty list of types matches no value", at);
      for (const json& t : *it) add(t);
    } else {
      add(*it);
    }
    return out;
  }

  // const, or enum: one literal per value (of a listed type, when types are listed).
  const Node* literals(const json& s, const std::vector<std::string>& types, const std::string& at) {
    if (has(s, "const") && has(s, "enum")) fail("schema {}: 'const' and 'enum' together are not supported", at);
    std::vector<json> values;
    if (has(s, "const")) {
      values.push_back(s["const"]);
    } else {
      const json& e = s["enum"];
      if (!e.is_array() || e.empty()) fail("schema {}/enum: must be a non-empty array", at);
      if (e.size() > kMaxValues) fail("schema {}/enum: {} values; at most {} are supported", at, e.size(), kMaxValues);
      values.assign(e.begin(), e.end());
    }
    Node* n = out_.add();
    n->kind = Node::Kind::Literal;
    for (const json& v : values) {
      bool typed = types.empty();
      for (const std::string& t : types) typed = typed || has_type(v, t);
      if (!typed) continue;
      std::string text = v.dump();
      if (std::find(n->texts.begin(), n->texts.end(), text) == n->texts.end()) n->texts.push_back(std::move(text));
    }
    if (n->texts.empty()) fail("schema {}: no 'enum'/'const' value has the schema's 'type'", at);
    return n;
  }

  const Node* of_type(const json& s, const std::string& t, const std::string& at) {
    if (t == "object") return object(s, at);
    if (t == "array") return array(s, at);
    if (t == "string") return string(s, at);
    if (t == "number" || t == "integer") {
      Node* n = out_.add();
      n->kind = Node::Kind::Number;
      n->integer = t == "integer";
      return n;
    }
    Node* n = out_.add();
    n->kind = Node::Kind::Literal;
    n->texts = t == "boolean" ? std::vector<std::string>{"true", "false"} : std::vector<std::string>{"null"};
    return n;
  }

  static int64_t count(const json& s, const char* key, int64_t dflt, const std::string& at) {
    auto it = s.find(key);
    if (it == s.end()) return dflt;
    if (!it->is_number_integer() || it->get<int64_t>() < 0)
      fail("schema {}/{}: must be a non-negative integer", at, key);
    return it->get<int64_t>();
  }

  const Node* object(const json& s, const std::string& at) {
    Node* n = out_.add();
    n->kind = Node::Kind::Object;
    std::set<std::string> required;
    if (auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) fail("schema {}/required: must be an array of strings", at);
      for (const json& r : *it) {
        if (!r.is_string()) fail("schema {}/required: must be an array of strings", at);
        required.insert(r.get<std::string>());
      }
    }
    auto props = s.find("properties");
    if (props != s.end()) {
      if (!props->is_object()) fail("schema {}/properties: must be an object", at);
      for (const auto& [key, value] : props->items())
        n->properties.push_back({json(key).dump(), compile(value, pointer_child(pointer_child(at, "properties"), key)),
                                 required.erase(key) > 0});
    }
    // Keys outside `properties` are never generated, so a required one could not be met.
    if (!required.empty())
      fail("schema {}/required: '{}' is not among the declared properties", at, printable(*required.begin()));
    if (props == s.end()) {  // no declared properties: any keys, values as additionalProperties says
      auto extra = s.find("additionalProperties");
      if (extra == s.end() || (extra->is_boolean() && extra->get<bool>())) n->extra = out_.any();
      else if (!extra->is_boolean()) n->extra = compile(*extra, pointer_child(at, "additionalProperties"));
    }
    return n;
  }

  const Node* array(const json& s, const std::string& at) {
    Node* n = out_.add();
    n->kind = Node::Kind::Array;
    if (auto u = s.find("uniqueItems"); u != s.end() && !(u->is_boolean() && !u->get<bool>()))
      fail("schema {}/uniqueItems: only false is supported", at);
    n->min_count = count(s, "minItems", 0, at);
    n->max_count = count(s, "maxItems", -1, at);
    auto items = s.find("items");
    if (items == s.end()) n->items = out_.any();
    else if (items->is_boolean() && !items->get<bool>()) n->max_count = 0;
    else n->items = compile(*items, pointer_child(at, "items"));
    if (n->max_count >= 0 && n->min_count > n->max_count) fail("schema {}: minItems > maxItems matches no value", at);
    return n;
  }

  const Node* string(const json& s, const std::string& at) {
    Node* n = out_.add();
    n->kind = Node::Kind::String;
    n->min_count = count(s, "minLength", 0, at);
    n->max_count = count(s, "maxLength", -1, at);
    if (n->max_count >= 0 && n->min_count > n->max_count) fail("schema {}: minLength > maxLength matches no value", at);
    return n;
  }

  Schema& out_;
  const json& root_;
  std::map<std::string, Node*> refs_;
};

Node* Schema::add() {
  if (nodes_.size() >= kMaxNodes) fail("schema: more than {} subschemas", kMaxNodes);
  nodes_.push_back(std::make_unique<Node>());
  return nodes_.back().get();
}

const Node* Schema::any() {
  if (any_) return any_;
  Node* n = add();  // a choice of every kind, objects and arrays holding any values again
  any_ = n;
  Node* obj = add();
  obj->kind = Node::Kind::Object;
  obj->extra = n;
  Node* arr = add();
  arr->kind = Node::Kind::Array;
  arr->items = n;
  Node* str = add();
  str->kind = Node::Kind::String;
  Node* num = add();
  num->kind = Node::Kind::Number;
  Node* lit = add();
  lit->kind = Node::Kind::Literal;
  lit->texts = {"true", "false", "null"};
  n->options = {obj, arr, str, num, lit};
  return n;
}

std::shared_ptr<const Schema> Schema::compile(const json& schema) {
  auto out = std::make_shared<Schema>();
  Compiler c(*out, schema);
  out->root_ = c.compile(schema, "#");
  return out;
}

std::shared_ptr<const Schema> Schema::any_object() {
  auto out = std::make_shared<Schema>();
  Node* obj = out->add();
  obj->kind = Node::Kind::Object;
  obj->extra = out->any();
  out->root_ = obj;
  return out;
}

}  // namespace vlm::grammar
