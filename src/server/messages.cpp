#include "server/messages.h"

#include <fmt/format.h>

#include <cctype>

#include "io/json.h"

namespace vlm::server {

namespace {

using json = Json;

// An image block's source as a chat image_url: base64 data as a data URL, a url as it is.
json image_part(const json& block, const std::string& at) {
  const json* src = field(block, "source");
  const json* ty = src && src->is_object() ? field(*src, "type") : nullptr;
  if (ty && *ty == "base64") {
    const json* media = field(*src, "media_type");
    const json* data = field(*src, "data");
    if (!media || !media->is_string() || !data || !data->is_string())
      refuse(400, fmt::format("'{}.source' must have string media_type and data", at), at + ".source");
    return {{"type", "image_url"},
            {"image_url", {{"url", fmt::format("data:{};base64,{}", media->get<std::string>(), data->get<std::string>())}}}};
  }
  if (ty && *ty == "url") {
    const json* url = field(*src, "url");
    if (!url || !url->is_string()) refuse(400, fmt::format("'{}.source.url' must be a string", at), at + ".source.url");
    return {{"type", "image_url"}, {"image_url", {{"url", *url}}}};
  }
  refuse(400, fmt::format("'{}.source' must be {{\"type\": \"base64\", ...}} or {{\"type\": \"url\", ...}}", at),
         at + ".source");
}

// The chat messages a request means, and for each the Messages field it came from.
ConvertedMessages chat_messages(const json& body) {
  ConvertedMessages out;
  if (const json* sys = field(body, "system")) out.add({{"role", "system"}, {"content", joined_text(*sys, "system", "text")}}, "system");
  const json* msgs = field(body, "messages");
  if (!msgs) refuse(400, "'messages' is required", "messages");
  if (!msgs->is_array()) wrong_type("messages", "an array", *msgs);
  if (msgs->empty()) refuse(400, "'messages' must contain at least one message", "messages");
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    const std::string at = fmt::format("messages[{}]", i);
    if (!m.is_object()) wrong_type(at, "an object", m);
    const json* role = field(m, "role");
    if (!role || (*role != "user" && *role != "assistant"))
      refuse(400, fmt::format("'{}.role' must be user or assistant (the system prompt is 'system')", at), at + ".role");
    const json* content = field(m, "content");
    if (!content) refuse(400, fmt::format("'{}.content' is required", at), at + ".content");
    if (content->is_string()) {
      out.add({{"role", *role}, {"content", *content}}, at);
      continue;
    }
    if (!content->is_array()) wrong_type(at + ".content", "a string or an array of content blocks", *content);
    json parts = json::array(), calls = json::array();
    for (size_t k = 0; k < content->size(); ++k) {
      const json& b = (*content)[k];
      const std::string bat = fmt::format("{}.content[{}]", at, k);
      const json* ty = b.is_object() ? field(b, "type") : nullptr;
      if (!ty || !ty->is_string()) refuse(400, fmt::format("'{}.type' must be a string", bat), bat + ".type");
      const std::string& t = ty->get_ref<const std::string&>();
      if (t == "text") {
        const json* tx = field(b, "text");
        if (!tx || !tx->is_string()) refuse(400, fmt::format("'{}.text' must be a string", bat), bat + ".text");
        parts.push_back({{"type", "text"}, {"text", *tx}});
      } else if (t == "image") {
        parts.push_back(image_part(b, bat));
      } else if (t == "tool_use" && *role == "assistant") {
        const json* id = field(b, "id");
        const json* name = field(b, "name");
        const json* input = field(b, "input");
        if (!id || !id->is_string() || !name || !name->is_string() || (input && !input->is_object()))
          refuse(400, fmt::format("'{}' must have string id and name and an object input", bat), bat);
        calls.push_back({{"id", *id}, {"type", "function"},
                         {"function", {{"name", *name}, {"arguments", dump(input ? *input : json::object())}}}});
      } else if (t == "tool_result" && *role == "user") {
        const json* id = field(b, "tool_use_id");
        if (!id || !id->is_string()) refuse(400, fmt::format("'{}.tool_use_id' must be a string", bat), bat + ".tool_use_id");
        const json* c = field(b, "content");
        std::string text = c ? joined_text(*c, bat + ".content", "text") : "";
        if (b.value("is_error", false)) text = "error: " + text;
        out.add({{"role", "tool"}, {"tool_call_id", *id}, {"content", text}}, bat);
      } else {
        refuse(400, fmt::format("'{}.type' '{}' is not supported in {} messages (text, image{} are)", bat, printable(t),
                                role->get<std::string>(), *role == "user" ? ", tool_result" : ", tool_use"),
               bat + ".type");
      }
    }
    if (!calls.empty()) {
      out.add({{"role", "assistant"}, {"content", parts.empty() ? json(nullptr) : parts}, {"tool_calls", calls}}, at);
    } else if (!parts.empty() || (*role == "assistant")) {
      out.add({{"role", *role}, {"content", parts}}, at);
    }
  }
  return out;
}

std::string anthropic_param(const std::string& p, const std::vector<std::string>& origin) {
  if (p.rfind("messages[", 0) == 0) {  // an image block's data is its source
    std::string o = origin_param(p, origin);
    if (o.size() > 10 && o.compare(o.size() - 10, 10, ".image_url") == 0) o.replace(o.size() - 10, 10, ".source");
    return o;
  }
  if (p == "max_completion_tokens") return "max_tokens";
  if (p == "stop") return "stop_sequences";
  if (p.rfind("tools[", 0) == 0) {
    const size_t f = p.find("].function");
    if (f == std::string::npos) return p;
    std::string rest = p.substr(f + 10);  // after "].function"
    if (rest.rfind(".parameters", 0) == 0) rest = ".input_schema" + rest.substr(11);
    return p.substr(0, f + 1) + rest;
  }
  if (p.rfind("tool_choice.function", 0) == 0) return "tool_choice" + p.substr(20);
  return p;
}

}  // namespace

MessagesRequest parse_anthropic(const json& body, const ImagePolicy& images) {
  if (!body.is_object()) wrong_type("body", "a JSON object", body);
  if (const json* t = field(body, "thinking"); t && t->value("type", "") != "disabled")
    refuse(400, "'thinking' is not supported: this model does not think before answering", "thinking");
  for (const char* key : {"container", "mcp_servers"})
    if (field(body, key)) refuse(400, fmt::format("'{}' is not supported", key), key);
  if (!field(body, "max_tokens")) refuse(400, "'max_tokens' is required", "max_tokens");
  ConvertedMessages msgs = chat_messages(body);
  // A final assistant message is the start of the answer, which goes on from it (Anthropic's
  // prefill); one without content is no prefill.
  bool prefill = false;
  if (const json& last = body["messages"].back(); last.value("role", "") == "assistant") {
    const json& c = last["content"];
    const std::string at = fmt::format("messages[{}].content", body["messages"].size() - 1);
    std::string text = c.is_string() ? c.get<std::string>() : "";
    if (c.is_array() && !c.empty() && c.back().value("type", "") == "text") text = c.back().value("text", "");
    if (c.empty() || (c.is_string() && text.empty())) {
      msgs.list.erase(msgs.list.size() - 1);
      msgs.origin.pop_back();
    } else if (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
      refuse(400, "final assistant content cannot end with trailing whitespace", at);
    } else {
      prefill = !text.empty();
    }
  }
  json chat{{"messages", msgs.list}};
  if (prefill) chat["continue_final_message"] = true;
  for (const char* key : {"model", "stream", "temperature", "top_p", "top_k"})
    if (const json* v = field(body, key)) chat[key] = *v;
  chat["max_completion_tokens"] = body["max_tokens"];
  if (const json* s = field(body, "stop_sequences")) chat["stop"] = *s;
  if (const json* tools = field(body, "tools"))
    chat["tools"] = chat_tools(*tools, "custom", true, [](const json& t) {
      json fn = json::object();
      if (const json* n = field(t, "name")) fn["name"] = *n;
      if (const json* d = field(t, "description")) fn["description"] = *d;
      if (const json* s = field(t, "input_schema")) fn["parameters"] = *s;
      return fn;
    });
  if (const json* c = field(body, "tool_choice")) {
    const json* ty = c->is_object() ? field(*c, "type") : nullptr;
    if (!ty || !ty->is_string())
      refuse(400, "'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}", "tool_choice");
    const std::string& t = ty->get_ref<const std::string&>();
    if (t == "auto" || t == "none")
      chat["tool_choice"] = t;
    else if (t == "any")
      chat["tool_choice"] = "required";
    else if (t == "tool")
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", c->value("name", json(nullptr))}}}};
    else
      refuse(400, fmt::format("'tool_choice.type' '{}' is not supported", printable(t)), "tool_choice.type");
    if (c->value("disable_parallel_tool_use", false)) chat["parallel_tool_calls"] = false;
  }
  MessagesRequest r;
  r.origin = std::move(msgs.origin);
  try {
    r.chat = parse_request(chat, Endpoint::Chat, images);
  } catch (ApiError& e) {
    name_for_anthropic(e, r.origin);
    throw;
  }
  return r;
}

void name_for_anthropic(ApiError& e, const std::vector<std::string>& origin) {
  rename_param(e, anthropic_param(e.param, origin));
}

Json anthropic_error_json(const ApiError& e) {
  const char* type = e.status == 400   ? "invalid_request_error"
                     : e.status == 401 ? "authentication_error"
                     : e.status == 403 ? "permission_error"
                     : e.status == 404 ? "not_found_error"
                     : e.status == 413 ? "request_too_large"
                     : e.status == 429 ? "rate_limit_error"
                     : e.status == 503 ? "overloaded_error"
                     : e.status < 500  ? "invalid_request_error"
                                       : "api_error";
  return {{"type", "error"}, {"error", {{"type", type}, {"message", e.message}}}};
}

std::string tool_use_id(const ToolCall& c) { return "toolu_" + c.id.substr(c.id.find('_') + 1); }

Json content_blocks(const MessageOut& m) {
  json blocks = json::array();
  if (!m.text.empty() || m.calls.empty()) blocks.push_back({{"type", "text"}, {"text", m.text}});
  for (const ToolCall& c : m.calls) {
    json input = json::parse(c.arguments, nullptr, false);
    blocks.push_back({{"type", "tool_use"}, {"id", tool_use_id(c)}, {"name", c.name},
                      {"input", input.is_object() ? input : json::object()}});
  }
  return blocks;
}

Json stop_sequence_json(const MessageOut& m) {
  return m.stop_reason == "stop_sequence" ? json(m.stop_sequence) : json(nullptr);
}

Json message_json(const MessageOut& m, bool streaming_start) {
  return {{"id", m.id},
          {"type", "message"},
          {"role", "assistant"},
          {"model", m.model},
          {"content", streaming_start ? json::array() : content_blocks(m)},
          {"stop_reason", streaming_start ? json(nullptr) : json(m.stop_reason)},
          {"stop_sequence", streaming_start ? json(nullptr) : stop_sequence_json(m)},
          {"usage", {{"input_tokens", m.input_tokens - m.cached_tokens},
                     {"cache_creation_input_tokens", 0},
                     {"cache_read_input_tokens", m.cached_tokens},
                     {"output_tokens", streaming_start ? 0 : m.output_tokens}}}};
}

}  // namespace vlm::server
