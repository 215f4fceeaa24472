#include "server/responses.h"

#include <fmt/format.h>

#include "io/json.h"

namespace vlm::server {

namespace {

constexpr const char* kLogprobsOutput = "message.output_text.logprobs";  // include: the text's logprobs

using json = Json;

// A content list of an input message as chat parts: input_text and output_text as text,
// input_image (a URL string) as image_url.
json chat_parts(const json& content, const std::string& at) {
  if (content.is_string()) return content;
  if (!content.is_array()) wrong_type(at, "a string or an array of content parts", content);
  json parts = json::array();
  for (size_t k = 0; k < content.size(); ++k) {
    const json& p = content[k];
    const std::string pat = fmt::format("{}[{}]", at, k);
    const json* ty = p.is_object() ? field(p, "type") : nullptr;
    if (!ty || !ty->is_string()) refuse(400, fmt::format("'{}.type' must be a string", pat), pat + ".type");
    const std::string& t = ty->get_ref<const std::string&>();
    if (t == "input_text" || t == "output_text") {
      const json* tx = field(p, "text");
      if (!tx || !tx->is_string()) refuse(400, fmt::format("'{}.text' must be a string", pat), pat + ".text");
      parts.push_back({{"type", "text"}, {"text", *tx}});
    } else if (t == "input_image") {
      const json* url = field(p, "image_url");
      if (!url || !url->is_string())
        refuse(400, fmt::format("'{}.image_url' must be a URL (file_id images are not stored here)", pat),
               pat + ".image_url");
      parts.push_back({{"type", "image_url"}, {"image_url", {{"url", *url}}}});
    } else {
      refuse(400, fmt::format("'{}.type' '{}' is not supported (input_text, input_image and output_text are)", pat,
                              printable(t)),
             pat + ".type");
    }
  }
  return parts;
}

// The chat messages an input means, and for each the Responses field it came from.
ConvertedMessages chat_messages(const json& body) {
  ConvertedMessages m;
  if (const json* ins = field(body, "instructions")) {
    if (!ins->is_string()) wrong_type("instructions", "a string", *ins);
    m.add({{"role", "system"}, {"content", *ins}}, "instructions");
  }
  const json* input = field(body, "input");
  if (!input) refuse(400, "'input' is required", "input");
  if (input->is_string()) {
    m.add({{"role", "user"}, {"content", *input}}, "input");
    return m;
  }
  if (!input->is_array()) wrong_type("input", "a string or an array of input items", *input);
  if (input->empty()) refuse(400, "'input' must contain at least one item", "input");
  for (size_t i = 0; i < input->size(); ++i) {
    const json& it = (*input)[i];
    const std::string at = fmt::format("input[{}]", i);
    if (!it.is_object()) wrong_type(at, "an object", it);
    const json* ty = field(it, "type");
    if (ty && !ty->is_string()) wrong_type(at + ".type", "a string", *ty);
    const std::string type = ty ? ty->get<std::string>() : "message";
    if (type == "message") {
      json msg = it;
      msg.erase("type");
      msg.erase("id");
      msg.erase("status");
      if (const json* c = field(it, "content")) msg["content"] = chat_parts(*c, at + ".content");
      m.add(std::move(msg), at);
    } else if (type == "function_call") {
      const json* name = field(it, "name");
      const json* args = field(it, "arguments");
      const json* id = field(it, "call_id");
      if (!name || !name->is_string() || !args || !args->is_string() || !id || !id->is_string())
        refuse(400, fmt::format("'{}' must have string call_id, name and arguments", at), at);
      json call{{"id", *id}, {"type", "function"}, {"function", {{"name", *name}, {"arguments", *args}}}};
      // Calls follow the assistant's message they belong to, or make one.
      if (!m.list.empty() && m.list.back().value("role", "") == "assistant") {
        m.list.back()["tool_calls"].push_back(std::move(call));
      } else {
        m.add({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", json::array({std::move(call)})}}, at);
      }
    } else if (type == "function_call_output") {
      const json* id = field(it, "call_id");
      const json* out = field(it, "output");
      if (!id || !id->is_string()) refuse(400, fmt::format("'{}.call_id' must be a string", at), at + ".call_id");
      if (!out) refuse(400, fmt::format("'{}.output' is required", at), at + ".output");
      m.add({{"role", "tool"}, {"tool_call_id", *id}, {"content", joined_text(*out, at + ".output", "input_text")}}, at);
    } else {
      refuse(400, fmt::format("'{}.type' '{}' is not supported (message, function_call and function_call_output "
                              "are; nothing is stored, so no item_reference)", at, printable(type)),
             at + ".type");
    }
  }
  return m;
}

// A chat request's param as the Responses request names it.
std::string responses_param(std::string p, const std::vector<std::string>& origin) {
  auto replace_prefix = [&](const std::string& from, const std::string& to) {
    if (p.rfind(from, 0) != 0) return false;
    p = to + p.substr(from.size());
    return true;
  };
  if (p.rfind("messages[", 0) == 0) return origin_param(p, origin);
  if (p == "messages") return "input";
  if (replace_prefix("max_completion_tokens", "max_output_tokens") ||
      replace_prefix("response_format.json_schema.schema", "text.format.schema") ||
      replace_prefix("response_format.json_schema", "text.format") || replace_prefix("response_format", "text.format") ||
      replace_prefix("tool_choice.function", "tool_choice"))
    return p;
  if (p.rfind("tools[", 0) == 0)
    if (const size_t f = p.find("].function"); f != std::string::npos) p.erase(f + 1, 9);
  return p;
}

// Fields whose feature this server does not have: refused rather than ignored.
void refuse_unsupported(const json& body) {
  if (field(body, "previous_response_id"))
    refuse(400, "'previous_response_id' is not supported: responses are not stored; send the conversation as input",
           "previous_response_id");
  if (const json* b = field(body, "background"); b && *b != false)
    refuse(400, "'background' responses are not supported", "background");
  for (const char* key : {"conversation", "prompt", "max_tool_calls"})
    if (field(body, key)) refuse(400, fmt::format("'{}' is not supported", key), key);
  if (const json* inc = field(body, "include")) {
    if (!inc->is_array()) wrong_type("include", "an array", *inc);
    for (size_t i = 0; i < inc->size(); ++i)
      if ((*inc)[i] != kLogprobsOutput)
        refuse(400, fmt::format("'include' may name only \"{}\" (no reasoning, search or file outputs here)", kLogprobsOutput),
               fmt::format("include[{}]", i));
  }
  if (const json* r = field(body, "reasoning"); r && r->is_object())
    for (const auto& [key, value] : r->items())
      if (!value.is_null()) refuse(400, "'reasoning' is not supported: this model does not reason", "reasoning");
  if (const json* t = field(body, "truncation"); t && *t != "disabled")
    refuse(400, "'truncation' must be \"disabled\": prompts over the context are refused, not cut", "truncation");
}

}  // namespace

ResponsesRequest parse_responses(const json& body, const ImagePolicy& images) {
  if (!body.is_object()) wrong_type("body", "a JSON object", body);
  refuse_unsupported(body);
  ConvertedMessages msgs = chat_messages(body);
  json chat{{"messages", msgs.list}};
  // Fields with the chat name, as they are.
  for (const char* key : {"model", "stream", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
                          "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "ignore_eos",
                          "parallel_tool_calls"})
    if (const json* v = field(body, key)) chat[key] = *v;
  if (const json* v = field(body, "max_output_tokens")) chat["max_completion_tokens"] = *v;
  // The message's logprobs: asked for by include, or by top_logprobs alone.
  const json* inc = field(body, "include");
  const json* top = field(body, "top_logprobs");
  if ((inc && !inc->empty()) || top) {  // include was checked above
    chat["logprobs"] = true;
    if (top) chat["top_logprobs"] = *top;
  }
  if (const json* tools = field(body, "tools"))
    chat["tools"] = chat_tools(*tools, "function", false, [](const json& t) {
      json fn = t;
      fn.erase("type");
      return fn;
    });
  if (const json* c = field(body, "tool_choice")) {
    if (c->is_object()) {
      if (const json* ty = field(*c, "type"); !ty || *ty != "function")
        refuse(400, "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"name\": ...}",
               "tool_choice");
      json fn = *c;
      fn.erase("type");
      chat["tool_choice"] = {{"type", "function"}, {"function", std::move(fn)}};
    } else {
      chat["tool_choice"] = *c;
    }
  }
  json format{{"type", "text"}};
  if (const json* text = field(body, "text")) {
    if (!text->is_object()) wrong_type("text", "an object", *text);
    if (const json* f = field(*text, "format")) {
      if (!f->is_object()) wrong_type("text.format", "an object", *f);
      format = *f;
      const json* ty = field(*f, "type");
      if (ty && *ty == "json_schema") {
        json js = *f;
        js.erase("type");
        chat["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(js)}};
      } else if (ty) {
        chat["response_format"] = {{"type", *ty}};
      }
    }
  }

  ResponsesRequest r;
  r.origin = std::move(msgs.origin);
  try {
    r.chat = parse_request(chat, Endpoint::Chat, images);
  } catch (ApiError& e) {
    name_for_responses(e, r.origin);
    throw;
  }
  auto or_null = [&](const char* key) { return field(body, key) ? *field(body, key) : json(nullptr); };
  r.echo = {{"instructions", or_null("instructions")},
            {"max_output_tokens", or_null("max_output_tokens")},
            {"metadata", field(body, "metadata") ? *field(body, "metadata") : json::object()},
            {"parallel_tool_calls", field(body, "parallel_tool_calls") ? *field(body, "parallel_tool_calls") : json(true)},
            {"previous_response_id", nullptr},
            {"reasoning", nullptr},
            {"store", false},
            {"temperature", or_null("temperature")},
            {"text", {{"format", format}}},
            {"tool_choice", field(body, "tool_choice") ? *field(body, "tool_choice") : json("auto")},
            {"tools", field(body, "tools") ? *field(body, "tools") : json::array()},
            {"top_logprobs", or_null("top_logprobs")},
            {"top_p", or_null("top_p")},
            {"truncation", "disabled"},
            {"user", or_null("user")}};
  return r;
}

void name_for_responses(ApiError& e, const std::vector<std::string>& origin) {
  rename_param(e, responses_param(e.param, origin));
}

std::string message_id(const std::string& response_id) { return "msg_" + response_id.substr(5); }
std::string call_item_id(const std::string& response_id, size_t k) {
  return fmt::format("fc_{}_{}", response_id.substr(5), k);
}

Json function_call_item(const std::string& response_id, size_t k, const ToolCall& c) {
  return {{"type", "function_call"}, {"id", call_item_id(response_id, k)}, {"call_id", c.id},
          {"name", c.name},          {"arguments", c.arguments},            {"status", "completed"}};
}

Json output_items(const ResponseOut& r) {
  json items = json::array();
  for (size_t k = 0; k < r.calls.size(); ++k) items.push_back(function_call_item(r.id, k, r.calls[k]));
  if (r.calls.empty())
    items.push_back({{"type", "message"},
                     {"id", message_id(r.id)},
                     {"status", r.incomplete ? "incomplete" : "completed"},
                     {"role", "assistant"},
                     {"content", json::array({{{"type", "output_text"}, {"text", r.text}, {"annotations", json::array()},
                                               {"logprobs", logprob_list(r.tokens)}}})}});
  return items;
}

Json response_json(const ResponseOut& r, const Json& echo, const std::string& status) {
  json j{{"id", r.id}, {"object", "response"}, {"created_at", r.created}, {"status", status}, {"error", nullptr}};
  j["incomplete_details"] = status == "incomplete" ? json{{"reason", "max_output_tokens"}} : json(nullptr);
  j["model"] = r.model;
  j["output"] = status == "in_progress" ? json::array() : output_items(r);
  for (const auto& [key, value] : echo.items()) j[key] = value;
  j["usage"] = status == "in_progress"
                   ? json(nullptr)
                   : json{{"input_tokens", r.usage.prompt_tokens},
                          {"input_tokens_details", {{"cached_tokens", r.usage.cached_tokens}}},
                          {"output_tokens", r.usage.completion_tokens},
                          {"output_tokens_details", {{"reasoning_tokens", 0}}},
                          {"total_tokens", r.usage.prompt_tokens + r.usage.completion_tokens}};
  return j;
}

std::string event(Json e, const char* type, int& seq) {
  json out{{"type", type}, {"sequence_number", seq++}};
  for (auto& [key, value] : e.items()) out[key] = std::move(value);
  return fmt::format("event: {}\ndata: {}\n\n", type, dump(out));
}

}  // namespace vlm::server
