#include "server/tools.h"

#include <fmt/format.h>

#include <random>

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

void read_tool_answer(ChoiceOut& c) {
  const json j = json::parse(c.text, nullptr, false);
  if (!j.is_object() || j.size() != 1) return;
  if (const auto calls = j.find("tool_calls"); calls != j.end() && calls->is_array() && !calls->empty()) {
    std::vector<ToolCall> out;
    for (const json& call : *calls) {
      if (!call.is_object() || !call.contains("name") || !call["name"].is_string() || !call.contains("arguments"))
        return;
      out.push_back({call_id(), call["name"].get<std::string>(), dump(call["arguments"])});
    }
    c.tool_calls = std::move(out);
    c.text.clear();
    c.finish = "tool_calls";
  } else if (const auto r = j.find("response"); r != j.end() && r->is_string()) {
    c.text = r->get<std::string>();
  }
}

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
