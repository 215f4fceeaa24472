// A JSON Schema compiled into the few node kinds the byte matcher walks (grammar/matcher.h):
// what `response_format: {"type": "json_schema", ...}` and `{"type": "json_object"}` ask of an
// answer. The supported subset, and what the matcher generates for it, is in
// docs/structured-output.md; every other keyword is refused by name, never ignored.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace vlm::grammar {

struct Node {
  enum class Kind { Object, Array, String, Number, Literal, Choice };
  Kind kind = Kind::Choice;

  // Object: the declared properties, generated in this order (optional ones may be left out).
  // Without declared properties any keys, each value matching `extra` (no extra keys when null).
  struct Property {
    std::string key;  // the key as JSON text, quotes included
    const Node* value = nullptr;
    bool required = false;
  };
  std::vector<Property> properties;
  const Node* extra = nullptr;

  // Array: `items` (null: no items at all), between min_items and max_items (-1: no limit).
  const Node* items = nullptr;
  // String: code points; Array: items.
  int64_t min_count = 0, max_count = -1;

  bool integer = false;  // Number: no fraction or exponent
  // Literal: the values it may be, each as exact bytes (enum and const values, true, false, null):
  // one node for a whole enum, so the matcher reads it as one frame however many values it has.
  std::vector<std::string> texts;
  std::vector<const Node*> options;  // Choice: one of these (anyOf, oneOf, a list of types)
};

class Schema {
 public:
  // Properties keep the order they have in the schema text (hence ordered_json).
  // Throws vlm::Error naming the keyword and its place (a JSON pointer) for anything outside the
  // supported subset, and for a schema no value can match.
  static std::shared_ptr<const Schema> compile(const nlohmann::ordered_json& schema);
  // Any JSON object: response_format {"type": "json_object"}.
  static std::shared_ptr<const Schema> any_object();

  const Node* root() const { return root_; }

  Schema() = default;
  Schema(const Schema&) = delete;
  Schema& operator=(const Schema&) = delete;

 private:
  friend class Compiler;
  Node* add();
  const Node* any();  // any JSON value (built once)

  std::vector<std::unique_ptr<Node>> nodes_;  // owned; $ref cycles point back into them
  const Node* root_ = nullptr;
  const Node* any_ = nullptr;
};

}  // namespace vlm::grammar
