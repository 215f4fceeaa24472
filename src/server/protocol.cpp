#include "server/protocol.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>

#include "core/error.h"
#include "io/json.h"
#include "server/tools.h"

namespace vlm::server {

using json = Json;

std::string ApiError::type() const {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 503: return "unavailable_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

void refuse(int status, std::string message, std::string param, std::string code) {
  throw ApiError{status, std::move(message), std::move(param), std::move(code)};
}

namespace {
json or_null(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }
}  // namespace

json error_json(const ApiError& e) {
  return {{"error", {{"message", e.message}, {"type", e.type()}, {"param", or_null(e.param)}, {"code", or_null(e.code)}}}};
}

json parse_body(std::string_view body) {
  try {
    return parse_ordered_json(body, "request body", 64);
  } catch (const Error& e) {
    refuse(400, e.what(), {}, "invalid_json");
  }
}

std::optional<std::vector<uint8_t>> base64_decode(std::string_view s) {
  static const std::array<int8_t, 256> table = [] {
    std::array<int8_t, 256> t{};
    t.fill(-1);
    const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i) t[uint8_t(a[i])] = int8_t(i);
    return t;
  }();
  while (!s.empty() && s.back() == '=') s.remove_suffix(1);
  if (s.size() % 4 == 1) return std::nullopt;
  std::vector<uint8_t> out;
  out.reserve(s.size() * 3 / 4);
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    const int v = table[uint8_t(c)];
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(uint8_t(acc >> bits));
    }
  }
  return out;
}

namespace {
const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::number_float: return "a number";
    default: return "an integer";
  }
}

}  // namespace

void wrong_type(const std::string& param, const char* want, const json& got) {
  refuse(400, fmt::format("'{}' must be {}, got {}", param, want, type_name(got)), param);
}

const json* field(const json& body, const char* key) {
  auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

std::string origin_param(const std::string& param, const std::vector<std::string>& origin) {
  if (param.rfind("messages[", 0) != 0) return param;
  size_t k = 0;
  const auto [end, ec] = std::from_chars(param.data() + 9, param.data() + param.size(), k);
  if (ec != std::errc() || end == param.data() + param.size() || *end != ']' || k >= origin.size()) return param;
  return origin[k] + std::string(end + 1);
}

Json chat_tools(const Json& tools, const char* type, bool type_optional, Json (*function_of)(const Json& tool)) {
  if (!tools.is_array()) wrong_type("tools", "an array of tools", tools);
  json out = json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const std::string at = fmt::format("tools[{}]", i);
    if (!t.is_object()) wrong_type(at, "an object", t);
    const json* ty = field(t, "type");
    if (ty ? *ty != type : !type_optional)
      refuse(400, fmt::format("'{}.type' must be \"{}\" (no built-in tools here)", at, type), at + ".type");
    out.push_back({{"type", "function"}, {"function", function_of(t)}});
  }
  return out;
}

std::string joined_text(const json& content, const std::string& param, const char* part_type) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) wrong_type(param, fmt::format("a string or an array of {} parts", part_type).c_str(), content);
  std::string text;
  for (const json& p : content) {
    const json* tx = p.is_object() && p.value("type", "") == part_type ? field(p, "text") : nullptr;
    if (!tx || !tx->is_string()) refuse(400, fmt::format("'{}' may hold only {} parts here", param, part_type), param);
    text += tx->get<std::string>();
  }
  return text;
}

void rename_param(ApiError& e, const std::string& param) {
  if (e.param.empty() || param == e.param) return;
  for (size_t at = e.message.find(e.param); at != std::string::npos; at = e.message.find(e.param, at + param.size()))
    e.message.replace(at, e.param.size(), param);
  e.param = param;
}

namespace {

std::optional<float> number(const json& body, const char* key, double lo, double hi) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) wrong_type(key, "a number", *v);
  const double d = v->get<double>();
  if (!(d >= lo && d <= hi)) refuse(400, fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, d), key);
  return float(d);
}

std::optional<int64_t> integer(const json& body, const char* key, int64_t lo, int64_t hi) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) wrong_type(key, "an integer", *v);
  // Unsigned values past int64 range are refused by the range check below.
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    refuse(400, fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, v->get<uint64_t>()), key);
  const int64_t i = v->get<int64_t>();
  if (i < lo || i > hi) refuse(400, fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, i), key);
  return i;
}

std::optional<bool> boolean(const json& body, const char* key) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) wrong_type(key, "a boolean", *v);
  return v->get<bool>();
}

ImageRef image_ref(const json& part, const std::string& param, const ImagePolicy& policy) {
  // {"type":"image_url","image_url":{"url":...}} or the plain-string form some clients send.
  auto iu = part.find("image_url");
  if (iu == part.end()) refuse(400, fmt::format("'{}.image_url' is missing", param), param + ".image_url");
  const json* url = &*iu;
  if (iu->is_object()) {
    auto u = iu->find("url");
    if (u == iu->end()) refuse(400, fmt::format("'{}.image_url.url' is missing", param), param + ".image_url.url");
    url = &*u;
  }
  const std::string up = param + ".image_url";
  if (!url->is_string()) wrong_type(up, "a URL string", *url);
  const std::string& s = url->get_ref<const std::string&>();
  ImageRef ref{up, {}, {}};
  if (s.rfind("data:", 0) == 0) {
    // data:[<media type>][;base64],<payload>; the format is sniffed from the bytes, not the type.
    const size_t comma = s.find(',');
    if (comma == std::string::npos || comma < 12 || s.compare(comma - 7, 7, ";base64") != 0)
      refuse(400, fmt::format("'{}': a data URL must be data:image/<format>;base64,<data>", up), up, "invalid_image_url");
    // Refused before decoding when even the fewest bytes the payload can hold are too many, and
    // after it by the exact count (unpadded base64 holds up to 2 bytes more than 3 per 4 chars).
    auto too_large = [&](const char* least, size_t n) {
      refuse(400, fmt::format("'{}': image of {}{} bytes exceeds the limit of {} bytes", up, least, n,
                              policy.max_image_bytes), up, "image_too_large");
    };
    const size_t payload = s.size() - comma - 1;
    if (payload / 4 * 3 > policy.max_image_bytes) too_large("at least ", payload / 4 * 3);
    auto bytes = base64_decode(std::string_view(s).substr(comma + 1));
    if (!bytes) refuse(400, fmt::format("'{}': the base64 data is malformed", up), up, "invalid_image_url");
    if (bytes->size() > policy.max_image_bytes) too_large("", bytes->size());
    ref.bytes = std::move(*bytes);
    return ref;
  }
  std::string path;
  if (s.rfind("file://", 0) == 0)
    path = s.substr(7);
  else if (s.rfind("http://", 0) == 0 || s.rfind("https://", 0) == 0)
    refuse(400, fmt::format("'{}': remote image URLs are not fetched by this server; send the image as a "
                            "data:image/...;base64 URL", up), up, "invalid_image_url");
  else if (s.find("://") == std::string::npos)
    path = s;  // a plain path (vlm batch)
  else
    refuse(400, fmt::format("'{}': unsupported URL scheme in '{}'", up, printable(s.substr(0, 40))), up,
           "invalid_image_url");
  if (!policy.allow_files)
    refuse(400, fmt::format("'{}': local image files are refused unless the server runs with --allow-file-images",
                            up), up, "invalid_image_url");
  ref.path = path;
  return ref;
}

// Text at the end of a message's last text part, a line apart: the template trims each part, so a
// separate part would lose the separation.
void append_text(text::ChatMessage& m, const std::string& t) {
  if (m.content.empty() || m.content.back().is_image)
    m.content.push_back({false, t});
  else
    m.content.back().text += m.content.back().text.empty() ? t : "\n" + t;
}

// An assistant message's tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}].
std::vector<ToolCall> parse_tool_calls(const json& calls, const std::string& at) {
  if (!calls.is_array()) wrong_type(at, "an array of tool calls", calls);
  std::vector<ToolCall> out;
  for (size_t k = 0; k < calls.size(); ++k) {
    const json& c = calls[k];
    const std::string cat = fmt::format("{}[{}]", at, k);
    const json* f = c.is_object() ? field(c, "function") : nullptr;
    const json* name = f && f->is_object() ? field(*f, "name") : nullptr;
    const json* args = f && f->is_object() ? field(*f, "arguments") : nullptr;
    if (!name || !name->is_string() || (args && !args->is_string()))
      refuse(400, fmt::format("'{}' must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", "
                              "\"arguments\": JSON text}}}}", cat), cat);
    const json* id = field(c, "id");
    if (id && !id->is_string()) wrong_type(cat + ".id", "a string", *id);
    out.push_back({id ? id->get<std::string>() : "", name->get<std::string>(), args ? args->get<std::string>() : "{}"});
  }
  return out;
}

std::vector<text::ChatMessage> parse_messages(const json& body, std::vector<ImageRef>& images,
                                              const ImagePolicy& policy) {
  const json* msgs = field(body, "messages");
  if (!msgs) refuse(400, "'messages' is required", "messages");
  if (!msgs->is_array()) wrong_type("messages", "an array", *msgs);
  if (msgs->empty()) refuse(400, "'messages' must contain at least one message", "messages");
  std::vector<text::ChatMessage> out;
  std::map<std::string, std::string> call_names;  // an earlier call's id → its function
  bool after_tool = false;  // out.back() holds tool results (server/tools.h): a user turn
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    const std::string at = fmt::format("messages[{}]", i);
    if (!m.is_object()) wrong_type(at, "an object", m);
    const json* role = field(m, "role");
    if (!role) refuse(400, fmt::format("'{}.role' is required", at), at + ".role");
    if (!role->is_string()) wrong_type(at + ".role", "a string", *role);
    std::string r = role->get<std::string>();
    if (r == "developer") r = "system";  // OpenAI's newer name for the system role
    if (r != "system" && r != "user" && r != "assistant" && r != "tool")
      refuse(400, fmt::format("'{}.role' must be system, developer, user, assistant or tool, got '{}'", at,
                              printable(r)), at + ".role");
    text::ChatMessage msg{r, {}};
    const json* content = field(m, "content");
    const json* calls = r == "assistant" ? field(m, "tool_calls") : nullptr;
    if (!content) {
      if (r != "assistant") refuse(400, fmt::format("'{}.content' is required", at), at + ".content");
      if (!calls) msg.content.push_back({false, {}});
    } else if (content->is_string()) {
      msg.content.push_back({false, content->get<std::string>()});
    } else if (content->is_array()) {
      for (size_t k = 0; k < content->size(); ++k) {
        const json& p = (*content)[k];
        const std::string pat = fmt::format("{}.content[{}]", at, k);
        if (!p.is_object()) wrong_type(pat, "an object", p);
        const json* ty = field(p, "type");
        if (!ty || !ty->is_string()) refuse(400, fmt::format("'{}.type' must be a string", pat), pat + ".type");
        const std::string& t = ty->get_ref<const std::string&>();
        if (t == "text") {
          const json* tx = field(p, "text");
          if (!tx || !tx->is_string()) refuse(400, fmt::format("'{}.text' must be a string", pat), pat + ".text");
          msg.content.push_back({false, tx->get<std::string>()});
        } else if (t == "image_url") {
          if (r != "user") refuse(400, fmt::format("'{}': images are accepted in user messages only", pat), pat);
          if (int(images.size()) >= policy.max_images)
            refuse(400, fmt::format("too many images: more than the limit of {} per request", policy.max_images),
                   pat, "too_many_images");
          images.push_back(image_ref(p, pat, policy));
          msg.content.push_back({true, {}});
        } else {
          refuse(400, fmt::format("'{}.type' '{}' is not supported (text and image_url are)", pat, printable(t)),
                 pat + ".type");
        }
      }
    } else {
      wrong_type(at + ".content", "a string or an array of content parts", *content);
    }
    if (calls) {  // the JSON the model answers with when it calls them
      const std::vector<ToolCall> cs = parse_tool_calls(*calls, at + ".tool_calls");
      for (const ToolCall& c : cs) call_names[c.id] = c.name;
      append_text(msg, tool_calls_text(cs));
    }
    if (r == "tool") {  // a result, in the user's turn (Gemma 3 has two roles)
      const json* id = field(m, "tool_call_id");
      if (id && !id->is_string()) wrong_type(at + ".tool_call_id", "a string", *id);
      const std::string call = id ? id->get<std::string>() : "";
      std::string result;
      for (const text::ChatPart& part : msg.content) result += part.text;
      auto name = call_names.find(call);
      msg = {"user", {{false, tool_result_text(name == call_names.end() ? "" : name->second, call, result)}}};
    }
    // Results, and the user's words after them, are one turn.
    if (after_tool && msg.role == "user") {
      for (text::ChatPart& part : msg.content)
        if (part.is_image)
          out.back().content.push_back(std::move(part));
        else
          append_text(out.back(), part.text);
    } else {
      out.push_back(std::move(msg));
    }
    after_tool = r == "tool" || (after_tool && r == "user");
  }
  return out;
}

std::vector<std::string> parse_stop(const json& body) {
  const json* v = field(body, "stop");
  if (!v) return {};
  if (v->is_string()) return {v->get<std::string>()};
  if (!v->is_array()) wrong_type("stop", "a string or an array of strings", *v);
  if (v->size() > 4) refuse(400, fmt::format("'stop' has {} entries; at most 4 are allowed", v->size()), "stop");
  std::vector<std::string> out;
  for (const json& s : *v) {
    if (!s.is_string()) wrong_type("stop", "a string or an array of strings", s);
    if (!s.get_ref<const std::string&>().empty()) out.push_back(s.get<std::string>());
  }
  return out;
}

// An array of token ids (integers in [0, 2^31)); their range against the vocabulary is the model's
// to check.
std::vector<int32_t> token_ids(const json& a, const std::string& param) {
  if (!a.is_array()) refuse(400, fmt::format("'{}' must be an array of token ids", param), param);
  std::vector<int32_t> ids;
  for (const json& id : a) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > std::numeric_limits<int32_t>::max())
      refuse(400, fmt::format("'{}' must be an array of token ids (integers >= 0)", param), param);
    ids.push_back(int32_t(id.get<int64_t>()));
  }
  return ids;
}

// The body's "model" (empty when not given).
std::string model_name(const json& body) {
  const json* m = field(body, "model");
  if (!m) return {};
  if (!m->is_string()) wrong_type("model", "a string", *m);
  return m->get<std::string>();
}

// response_format: text (null), json_object (any object) or json_schema (its schema, compiled here
// so that an unsupported keyword is a 400 naming it; "strict" is accepted and always holds; no
// schema is any object, as llama-server takes it).
std::shared_ptr<const grammar::Schema> response_format(const json& rf) {
  const json* ty = rf.is_object() ? field(rf, "type") : nullptr;
  if (!ty || !ty->is_string()) refuse(400, "'response_format' must be an object with a string 'type'", "response_format");
  const std::string& t = ty->get_ref<const std::string&>();
  if (t == "text") return nullptr;
  if (t == "json_object") return grammar::Schema::any_object();
  if (t != "json_schema")
    refuse(400, fmt::format("'response_format.type' '{}' is not supported (text, json_object and json_schema are)",
                            printable(t)), "response_format.type");
  const json* js = field(rf, "json_schema");
  if (!js || !js->is_object())
    refuse(400, "'response_format.json_schema' must be an object with a 'schema'", "response_format.json_schema");
  if (const json* name = field(*js, "name"); name && !name->is_string())
    wrong_type("response_format.json_schema.name", "a string", *name);
  if (const json* strict = field(*js, "strict"); strict && !strict->is_boolean() && !strict->is_null())
    wrong_type("response_format.json_schema.strict", "a boolean", *strict);
  const json* schema = field(*js, "schema");
  if (!schema) return grammar::Schema::any_object();  // as llama.cpp: no schema, any object
  try {
    return grammar::Schema::compile(*schema);
  } catch (const Error& e) {
    refuse(400, fmt::format("'response_format.json_schema.schema': {}", e.what()), "response_format.json_schema.schema");
  }
}

}  // namespace

TokenizeRequest parse_tokenize(const json& body, const ImagePolicy& images) {
  if (!body.is_object()) wrong_type("body", "a JSON object", body);
  const bool chat = field(body, "messages") != nullptr;
  if (chat == (field(body, "prompt") != nullptr)) refuse(400, "give either 'prompt' or 'messages'", "prompt");
  TokenizeRequest t;
  t.request = parse_request(body, chat ? Endpoint::Chat : Endpoint::Completion, images);
  if (!chat && (t.request.prompts.size() != 1 || t.request.prompts[0].ids))
    refuse(400, "'prompt' must be one string here", "prompt");
  t.add_special_tokens = boolean(body, "add_special_tokens").value_or(!chat);
  t.return_token_strs = boolean(body, "return_token_strs").value_or(false);
  if (chat && t.add_special_tokens)
    refuse(400, "'add_special_tokens' must be false with 'messages': the chat template begins with <bos> itself",
           "add_special_tokens");
  return t;
}

DetokenizeRequest parse_detokenize(const json& body) {
  if (!body.is_object()) wrong_type("body", "a JSON object", body);
  DetokenizeRequest out;
  out.model = model_name(body);
  const json* ids = field(body, "tokens");
  if (!ids) refuse(400, "'tokens' must be an array of token ids", "tokens");
  out.tokens = token_ids(*ids, "tokens");
  return out;
}

namespace {

// "tools", "tool_choice" and "parallel_tool_calls" (chat): nullopt without tools or with
// tool_choice "none". Function names as OpenAI allows them; parameters compile (grammar/).
std::optional<ToolUse> parse_tools(const json& body, Endpoint endpoint) {
  const json* t = field(body, "tools");
  const json* c = field(body, "tool_choice");
  const bool none = c && c->is_string() && *c == "none";
  if (!t || (t->is_array() && t->empty())) {
    if (c && !none) refuse(400, "'tool_choice' needs 'tools'", "tool_choice");
    return std::nullopt;
  }
  if (endpoint != Endpoint::Chat) refuse(400, "'tools' are for chat completions", "tools");
  if (!t->is_array()) wrong_type("tools", "an array of tools", *t);
  if (t->size() > 128) refuse(400, fmt::format("'tools' lists {} tools; at most 128", t->size()), "tools");
  std::vector<Function> fns;
  for (size_t i = 0; i < t->size(); ++i) {
    const json& tool = (*t)[i];
    const std::string at = fmt::format("tools[{}]", i);
    if (!tool.is_object()) wrong_type(at, "an object", tool);
    const json* ty = field(tool, "type");
    if (!ty || *ty != "function") refuse(400, fmt::format("'{}.type' must be \"function\"", at), at + ".type");
    const json* f = field(tool, "function");
    if (!f || !f->is_object()) refuse(400, fmt::format("'{}.function' must be an object", at), at + ".function");
    const json* name = field(*f, "name");
    const std::string nat = at + ".function.name";
    if (!name || !name->is_string()) refuse(400, fmt::format("'{}' must be a string", nat), nat);
    const std::string& n = name->get_ref<const std::string&>();
    if (n.empty() || n.size() > 64 ||
        n.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != std::string::npos)
      refuse(400, fmt::format("'{}' must be 1 to 64 letters, digits, '_' or '-', got '{}'", nat, shorten(n)), nat);
    for (const Function& other : fns)
      if (other.name == n) refuse(400, fmt::format("'{}': '{}' is named twice", nat, n), nat);
    Function fn{n, {}, {{"type", "object"}, {"properties", json::object()}, {"additionalProperties", false}}};
    if (const json* d = field(*f, "description")) {
      if (!d->is_string()) wrong_type(at + ".function.description", "a string", *d);
      fn.description = d->get<std::string>();
    }
    if (const json* p = field(*f, "parameters")) {
      const std::string pat = at + ".function.parameters";
      if (!p->is_object()) wrong_type(pat, "a JSON Schema object", *p);
      try {
        grammar::Schema::compile(*p);
      } catch (const Error& e) {
        refuse(400, fmt::format("'{}': {}", pat, e.what()), pat);
      }
      fn.parameters = *p;
    }
    if (const json* s = field(*f, "strict"); s && !s->is_boolean()) wrong_type(at + ".function.strict", "a boolean", *s);
    fns.push_back(std::move(fn));
  }
  if (none) return std::nullopt;
  ToolChoice choice = ToolChoice::Auto;
  std::string named;
  if (c && c->is_string()) {
    if (*c == "required")
      choice = ToolChoice::Required;
    else if (*c != "auto")
      refuse(400, fmt::format("'tool_choice' must be none, auto, required or a function, got '{}'",
                              shorten(c->get<std::string>())), "tool_choice");
  } else if (c) {
    const json* f = c->is_object() ? field(*c, "function") : nullptr;
    const json* n = f && f->is_object() ? field(*f, "name") : nullptr;
    if (!n || !n->is_string())
      refuse(400, "'tool_choice' must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}",
             "tool_choice");
    named = n->get<std::string>();
    if (std::none_of(fns.begin(), fns.end(), [&](const Function& fn) { return fn.name == named; }))
      refuse(400, fmt::format("'tool_choice' names '{}', which is not in 'tools'", shorten(named)),
             "tool_choice.function.name");
    choice = ToolChoice::Named;
  }
  const bool parallel = boolean(body, "parallel_tool_calls").value_or(true);
  try {
    return tool_use(fns, choice, named, parallel);
  } catch (const Error& e) {  // each function's parameters compile, yet together may pass the bounds
    refuse(400, fmt::format("'tools': {}", e.what()), "tools");
  }
}

// The most choices one request may ask for (n, times the prompts of a list): OpenAI's bound on n.
constexpr int kMaxChoices = 128;

// A token-id prompt: a non-empty array of ids.
Prompt id_prompt(const json& a, const std::string& param) {
  Prompt p{{}, token_ids(a, param)};
  if (p.ids->empty()) refuse(400, fmt::format("'{}' is an empty list of token ids", param), param);
  return p;
}

// "prompt" as the completions API takes it: a string, a list of strings, a list of token ids or a
// list of such lists.
std::vector<Prompt> parse_prompts(const json& body) {
  const json* p = field(body, "prompt");
  if (!p) refuse(400, "'prompt' is required", "prompt");
  if (p->is_string()) return {Prompt{p->get<std::string>(), {}}};
  if (!p->is_array()) wrong_type("prompt", "a string, a list of strings, token ids or lists of token ids", *p);
  if (p->empty()) refuse(400, "'prompt' is an empty list", "prompt");
  if (p->front().is_number()) return {id_prompt(*p, "prompt")};
  if (p->size() > size_t(kMaxChoices))
    refuse(400, fmt::format("'prompt' lists {} prompts; at most {}", p->size(), kMaxChoices), "prompt");
  std::vector<Prompt> out;
  const bool strings = p->front().is_string();
  for (size_t i = 0; i < p->size(); ++i) {
    const json& e = (*p)[i];
    const std::string at = fmt::format("prompt[{}]", i);
    if (strings && e.is_string())
      out.push_back({e.get<std::string>(), {}});
    else if (!strings && e.is_array())
      out.push_back(id_prompt(e, at));
    else
      refuse(400, "'prompt' must be a string, a list of strings, token ids or lists of token ids, not a mixture",
             at);
  }
  return out;
}

}  // namespace

ApiRequest parse_request(const json& body, Endpoint endpoint, const ImagePolicy& images) {
  if (!body.is_object()) wrong_type("body", "a JSON object", body);
  ApiRequest r;
  r.endpoint = endpoint;
  r.model = model_name(body);
  r.n = int(integer(body, "n", 1, kMaxChoices).value_or(1));
  if (auto b = integer(body, "best_of", 1, 128); b && *b != 1)
    refuse(400, "'best_of' other than 1 is not supported", "best_of");
  if (field(body, "functions")) refuse(400, "'functions' is not supported (send 'tools')", "functions");
  // Outputs this model cannot give, refused rather than ignored (a prediction only speeds up an
  // answer, so it is taken and changes nothing).
  if (const json* m = field(body, "modalities")) {
    if (!m->is_array()) wrong_type("modalities", "an array", *m);
    for (const json& x : *m)
      if (x != "text") refuse(400, "'modalities' may name only \"text\": this model answers in text", "modalities");
  }
  if (field(body, "audio")) refuse(400, "'audio' output is not supported: this model answers in text", "audio");
  if (field(body, "web_search_options"))
    refuse(400, "'web_search_options' is not supported: this server does not search the web", "web_search_options");
  if (const json* e = field(body, "reasoning_effort"); e && *e != "none")
    refuse(400, "'reasoning_effort' other than \"none\" is not supported: this model does not reason", "reasoning_effort");
  if (const json* rf = field(body, "response_format")) r.response_schema = response_format(*rf);
  std::optional<ToolUse> tools = parse_tools(body, endpoint);
  if (tools && r.response_schema)
    refuse(400, "'response_format' cannot be combined with 'tools' (the answer is then the tool-call JSON)",
           "response_format");
  if (field(body, "suffix")) refuse(400, "'suffix' is not supported", "suffix");
  if (const json* lb = field(body, "logit_bias"); lb && !lb->is_null()) {
    if (!lb->is_object()) wrong_type("logit_bias", "an object of token ids to biases", *lb);
    if (lb->size() > 1024) refuse(400, fmt::format("'logit_bias' has {} entries; at most 1024", lb->size()), "logit_bias");
    for (const auto& [key, bias] : lb->items()) {
      int64_t id = -1;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
      if (ec != std::errc() || end != key.data() + key.size() || id < 0 || id > std::numeric_limits<int32_t>::max())
        refuse(400, fmt::format("'logit_bias' key '{}' is not a token id", shorten(key)), "logit_bias");
      if (!bias.is_number() || !(bias.get<double>() >= -100 && bias.get<double>() <= 100))
        refuse(400, fmt::format("'logit_bias[{}]' must be a number in [-100, 100]", id), "logit_bias");
      r.logit_bias.emplace_back(int32_t(id), bias.get<float>());
    }
  }

  r.stream = boolean(body, "stream").value_or(false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) wrong_type("stream_options", "an object", *so);
    if (!r.stream) refuse(400, "'stream_options' is only allowed when 'stream' is true", "stream_options");
    r.include_usage = boolean(*so, "include_usage").value_or(false);
  }

  const char* max_key = "max_tokens";
  std::optional<int64_t> max_tokens;
  if (endpoint == Endpoint::Chat && field(body, "max_completion_tokens")) {
    max_key = "max_completion_tokens";
    max_tokens = integer(body, max_key, 1, std::numeric_limits<int32_t>::max());
  } else {
    max_tokens = integer(body, max_key, endpoint == Endpoint::Chat ? 1 : 0, std::numeric_limits<int32_t>::max());
  }
  if (max_tokens) r.max_tokens = int(*max_tokens);
  r.max_tokens_param = max_key;
  r.temperature = number(body, "temperature", 0, 2);
  r.top_p = number(body, "top_p", 0, 1);
  if (r.top_p && *r.top_p == 0.f) refuse(400, "'top_p' must be in (0, 1], got 0", "top_p");
  r.min_p = number(body, "min_p", 0, 1);
  r.presence_penalty = number(body, "presence_penalty", -2, 2);
  r.frequency_penalty = number(body, "frequency_penalty", -2, 2);
  r.repetition_penalty = number(body, "repetition_penalty", 0.01, 10);
  if (auto k = integer(body, "top_k", -1, 1 << 20)) r.top_k = int(*k < 0 ? 0 : *k);  // vLLM: -1 = off
  if (const json* s = field(body, "seed")) {
    if (!s->is_number_integer()) wrong_type("seed", "an integer", *s);
    r.seed = s->is_number_unsigned() ? s->get<uint64_t>() : uint64_t(s->get<int64_t>());
  }
  r.stop = parse_stop(body);
  r.return_token_ids = boolean(body, "return_token_ids").value_or(false);
  r.ignore_eos = boolean(body, "ignore_eos").value_or(false);
  if (const json* ids = field(body, "stop_token_ids"); ids && !ids->is_null()) {
    r.stop_token_ids = token_ids(*ids, "stop_token_ids");
    if (r.stop_token_ids.size() > 1024)
      refuse(400, fmt::format("'stop_token_ids' has {} entries; at most 1024", r.stop_token_ids.size()), "stop_token_ids");
  }
  r.min_tokens = int(integer(body, "min_tokens", 0, std::numeric_limits<int32_t>::max()).value_or(0));
  if (r.max_tokens && r.min_tokens > *r.max_tokens)
    refuse(400, fmt::format("'min_tokens' ({}) must not exceed '{}' ({})", r.min_tokens, max_key, *r.max_tokens),
           "min_tokens");
  r.include_stop_str_in_output = boolean(body, "include_stop_str_in_output").value_or(false);
  if (auto k = integer(body, "prompt_logprobs", 0, 20)) {
    // vLLM: a stream has no place for them (0 asks for none there).
    if (r.stream && *k > 0) refuse(400, "'prompt_logprobs' are not available when 'stream' is true", "prompt_logprobs");
    if (!r.stream) r.prompt_logprobs = int(*k);
  }

  if (endpoint == Endpoint::Chat) {
    const bool lp = boolean(body, "logprobs").value_or(false);
    auto top = integer(body, "top_logprobs", 0, 20);
    if (top && !lp) refuse(400, "'top_logprobs' requires 'logprobs' to be true", "top_logprobs");
    if (lp) r.top_logprobs = int(top.value_or(0));
    r.messages = parse_messages(body, r.images, images);
    // vLLM's: continue_final_message goes on from the final assistant message (a prefill), so it
    // takes add_generation_prompt false, its default then.
    const bool go_on = boolean(body, "continue_final_message").value_or(false);
    const bool turn = boolean(body, "add_generation_prompt").value_or(!go_on);
    if (go_on && turn)
      refuse(400, "'continue_final_message' needs 'add_generation_prompt' false", "continue_final_message");
    r.chat_end = go_on ? text::ChatEnd::ContinueFinal : turn ? text::ChatEnd::GenerationPrompt : text::ChatEnd::LastTurn;
    if (go_on && tools)
      refuse(400, "'continue_final_message' cannot be combined with 'tools' (the answer is then the tool-call JSON)",
             "continue_final_message");
    if (tools) {  // the functions and the answer's form, at the end of the system turn
      if (r.messages.front().role != "system") r.messages.insert(r.messages.begin(), {"system", {}});
      append_text(r.messages.front(), tools->instructions);
      r.response_schema = tools->schema;
      r.tool_answer = true;
    }
  } else {
    if (auto lp = integer(body, "logprobs", 0, 5)) r.top_logprobs = int(*lp);
    r.echo = boolean(body, "echo").value_or(false);
    r.prompts = parse_prompts(body);
    if (r.prompts.size() * size_t(r.n) > size_t(kMaxChoices))
      refuse(400, fmt::format("{} prompts × n = {} asks for {} choices; at most {}", r.prompts.size(), r.n,
                              r.prompts.size() * size_t(r.n), kMaxChoices), "n");
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// Responses

json usage_json(const UsageOut& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}, {"image_tokens", u.image_tokens}}}};
}

namespace {

json head(const ResponseMeta& m, const char* object) {
  return {{"id", m.id}, {"object", object}, {"created", m.created}, {"model", m.model},
          {"system_fingerprint", m.fingerprint}};
}

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

// chat: {"content": [...], "refusal": null}
json chat_logprobs(const std::vector<TokenOut>& tokens) { return {{"content", logprob_list(tokens)}, {"refusal", nullptr}}; }

// completions (legacy): {"tokens", "token_logprobs", "top_logprobs": [{piece: lp}], "text_offset"}
json legacy_logprobs(const std::vector<TokenOut>& tokens, size_t offset) {
  json toks = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  for (const TokenOut& t : tokens) {
    toks.push_back(t.piece);
    lps.push_back(t.unscored ? json(nullptr) : json(t.logprob));
    json top = json::object();
    for (const auto& [piece, lp] : t.top) top[piece] = lp;
    tops.push_back(t.unscored ? json(nullptr) : top);
    offs.push_back(offset);
    offset += t.text.size();
  }
  return {{"tokens", toks}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

}  // namespace

Json logprob_list(const std::vector<TokenOut>& tokens) {
  json out = json::array();
  for (const TokenOut& t : tokens) {
    json top = json::array();
    for (const auto& [piece, lp] : t.top) top.push_back({{"token", piece}, {"logprob", lp}, {"bytes", bytes_of(piece)}});
    out.push_back({{"token", t.piece}, {"logprob", t.logprob}, {"bytes", bytes_of(t.piece)}, {"top_logprobs", top}});
  }
  return out;
}

namespace {

json stop_reason_json(const engine::StopReason& r) {
  if (const auto* id = std::get_if<int32_t>(&r)) return *id;
  if (const auto* text = std::get_if<std::string>(&r)) return *text;
  return nullptr;
}

// A choice's vLLM keys after its other keys: stop_reason once it finished, token_ids
// (return_token_ids).
json with_extras(json c, const ChoiceOut& o) {
  if (!o.finish.empty()) c["stop_reason"] = stop_reason_json(o.stop_reason);
  if (o.token_ids) c["token_ids"] = *o.token_ids;
  return c;
}

json completion_choice(const ChoiceOut& c, bool logprobs) {
  return with_extras({{"index", c.index},
                      {"text", c.text},
                      {"logprobs", logprobs ? legacy_logprobs(c.tokens, 0) : json(nullptr)},
                      {"finish_reason", or_null(c.finish)}},
                     c);
}

// message.tool_calls.
json tool_calls_json(const std::vector<ToolCall>& calls) {
  json out = json::array();
  for (const ToolCall& c : calls)
    out.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  return out;
}

// A stream delta's tool_calls: a call's first piece with its id, type and name, as OpenAI's.
json tool_call_deltas_json(const std::vector<ToolCallDelta>& deltas) {
  json out = json::array();
  for (const ToolCallDelta& d : deltas)
    out.push_back(d.id.empty() ? json{{"index", d.index}, {"function", {{"arguments", d.arguments}}}}
                               : json{{"index", d.index},
                                      {"id", d.id},
                                      {"type", "function"},
                                      {"function", {{"name", d.name}, {"arguments", d.arguments}}}});
  return out;
}

json chat_chunk(const ResponseMeta& m, json choice, bool usage_null) {
  json j = head(m, "chat.completion.chunk");
  j["choices"] = json::array({std::move(choice)});
  if (usage_null) j["usage"] = nullptr;
  return j;
}

}  // namespace

json chat_response(const ResponseMeta& m, const std::vector<ChoiceOut>& choices, bool logprobs, const UsageOut& u) {
  json j = head(m, "chat.completion");
  j["choices"] = json::array();
  for (const ChoiceOut& c : choices) {
    json msg{{"role", "assistant"}, {"content", c.tool_calls.empty() ? json(c.text) : json(nullptr)}, {"refusal", nullptr}};
    if (!c.tool_calls.empty()) msg["tool_calls"] = tool_calls_json(c.tool_calls);
    j["choices"].push_back(with_extras({{"index", c.index},
                                        {"message", std::move(msg)},
                                        {"logprobs", logprobs ? chat_logprobs(c.tokens) : json(nullptr)},
                                        {"finish_reason", c.finish}},
                                       c));
  }
  j["usage"] = usage_json(u);
  return j;
}

json completion_response(const ResponseMeta& m, const std::vector<ChoiceOut>& choices, bool logprobs,
                         const UsageOut& u) {
  json j = head(m, "text_completion");
  j["choices"] = json::array();
  for (const ChoiceOut& c : choices) j["choices"].push_back(completion_choice(c, logprobs));
  j["usage"] = usage_json(u);
  return j;
}

json chat_role_chunk(const ResponseMeta& m, int index, bool usage_null) {
  return chat_chunk(m,
                    {{"index", index},
                     {"delta", {{"role", "assistant"}, {"content", ""}, {"refusal", nullptr}}},
                     {"logprobs", nullptr},
                     {"finish_reason", nullptr}},
                    usage_null);
}

json chat_delta_chunk(const ResponseMeta& m, const ChoiceOut& c, bool logprobs, bool usage_null) {
  // A finish on its own has an empty delta, as OpenAI's last chunk of a choice.
  json delta = c.text.empty() && !c.finish.empty() ? json::object() : json{{"content", c.text}};
  if (!c.call_deltas.empty()) delta = {{"tool_calls", tool_call_deltas_json(c.call_deltas)}};
  return chat_chunk(m,
                    with_extras({{"index", c.index},
                                 {"delta", std::move(delta)},
                                 {"logprobs", logprobs && !c.tokens.empty() ? chat_logprobs(c.tokens) : json(nullptr)},
                                 {"finish_reason", or_null(c.finish)}},
                                c),
                    usage_null);
}

json completion_chunk(const ResponseMeta& m, const ChoiceOut& c, bool logprobs, bool usage_null) {
  json j = head(m, "text_completion");
  j["choices"] = json::array({completion_choice(c, logprobs && !c.tokens.empty())});
  if (usage_null) j["usage"] = nullptr;
  return j;
}

json usage_chunk(const ResponseMeta& m, Endpoint endpoint, const UsageOut& u) {
  json j = head(m, endpoint == Endpoint::Chat ? "chat.completion.chunk" : "text_completion");
  j["choices"] = json::array();
  j["usage"] = usage_json(u);
  return j;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }

}  // namespace vlm::server
