// The OpenAI wire contract of `vlm serve` and `vlm batch` (openai-node's
// resources/chat/completions, resources/completions, core/streaming): request
// JSON in, an ApiRequest out with every field type- and range-checked, and the
// response, stream-chunk and error JSON writers. Nothing here touches the model.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/sequence.h"
#include "grammar/schema.h"
#include "text/chat.h"

namespace vlm::server {

// Objects keep their keys in order: a response_format schema's properties are generated in the
// order the client wrote them, and responses list their keys in the order OpenAI's do.
using Json = nlohmann::ordered_json;

// A request the server refuses, answered as {"error": {message, type, param, code}}.
// Client mistakes are 4xx: openai-node retries 429 and every 5xx, so a mistake must never be one.
struct ApiError {
  int status = 400;
  std::string message;
  std::string param;  // empty = null
  std::string code;   // empty = null
  std::string type() const;  // from the status: invalid_request_error, authentication_error, ...
};
[[noreturn]] void refuse(int status, std::string message, std::string param = {}, std::string code = {});
Json error_json(const ApiError& e);
// A 400 naming `param`: it must be `want` ("a string"), and is not.
[[noreturn]] void wrong_type(const std::string& param, const char* want, const Json& got);
// The body's `key`, or null when absent or JSON null (openai-node sends explicit nulls).
const Json* field(const Json& body, const char* key);
// The error names `param` instead, in its param and every mention in its message: for the APIs
// read into a chat request (responses.h, messages.h), whose fields have names of their own.
void rename_param(ApiError& e, const std::string& param);
// "messages[k]…" as the field chat message k came from (origin[k] + "…"); other params as they are.
std::string origin_param(const std::string& param, const std::vector<std::string>& origin);
// Chat messages read from another API's request, each with the field it came from.
struct ConvertedMessages {
  Json list = Json::array();
  std::vector<std::string> origin;
  void add(Json message, std::string from) {
    list.push_back(std::move(message));
    origin.push_back(std::move(from));
  }
};
// Another API's "tools" as chat function tools: an array of objects of type `type` (absent too
// where `type_optional`), each function's fields (name, description, parameters) from
// `function_of`; else a 400 naming the field.
Json chat_tools(const Json& tools, const char* type, bool type_optional, Json (*function_of)(const Json& tool));
// A string, or parts {"type": part_type, "text"} joined (a tool result's content); else a 400
// naming `param`.
std::string joined_text(const Json& content, const std::string& param, const char* part_type);

enum class Endpoint { Chat, Completion };

// Where image URLs may point. data: URIs always; the others only when the operator allows.
struct ImagePolicy {
  bool allow_files = false;  // file:// URLs and (vlm batch) plain paths
  int max_images = 8;        // per request
  uint64_t max_image_bytes = 20u << 20;  // per encoded image
};

// One prompt of /v1/completions: text (tokenized with <bos> first, as HF's tokenizer does), or
// token ids taken as they are.
struct Prompt {
  std::string text;
  std::optional<std::vector<int32_t>> ids;
};

struct ImageRef {
  std::string param;                  // "messages[1].content[0].image_url"
  std::vector<uint8_t> bytes;         // a data: URI's payload, base64-decoded
  std::string path;                   // a file:// URL or a plain path (when allowed)
};

// Sampling fields are optional: the checkpoint's generation_config.json fills the absent ones.
struct ApiRequest {
  Endpoint endpoint = Endpoint::Chat;
  std::string model;                            // empty = not given
  std::vector<text::ChatMessage> messages;      // chat
  std::vector<ImageRef> images;                 // chat, in prompt order
  std::vector<Prompt> prompts;                  // completions: one or a list, each answered n times
  int n = 1;                                    // choices per prompt
  bool stream = false;
  bool include_usage = false;                   // stream_options.include_usage
  std::optional<int> max_tokens;
  std::string max_tokens_param = "max_tokens";  // the key it came in (max_completion_tokens)
  std::optional<float> temperature, top_p, min_p, presence_penalty, frequency_penalty, repetition_penalty;
  std::optional<int> top_k;
  std::vector<std::pair<int32_t, float>> logit_bias;  // token id → bias in [-100, 100]
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  int top_logprobs = -1;                        // -1 = no logprobs; chat: top_logprobs, completions: logprobs
  bool echo = false;                            // completions: prompt text before the answer
  // vLLM's prompt_logprobs: each prompt token's logprob and rank with this many alternatives, in a
  // whole (not streamed) response; -1: none.
  int prompt_logprobs = -1;
  bool return_token_ids = false;                // vLLM's extension: each choice's token_ids
  bool ignore_eos = false;                      // vLLM's extension: only max_tokens and stop strings end it
  // vLLM's extensions: ids that end the answer besides eos, no stop before min_tokens tokens, the
  // matched stop string kept in the text.
  std::vector<int32_t> stop_token_ids;
  int min_tokens = 0;
  bool include_stop_str_in_output = false;
  // response_format json_object / json_schema, or the tool-call JSON (server/tools.h), compiled
  // (null: text).
  std::shared_ptr<const grammar::Schema> response_schema;
  bool tool_answer = false;  // the answer is tools.h's JSON, read into tool calls or content
  // chat: how the prompt ends (add_generation_prompt, continue_final_message: HF's and vLLM's).
  text::ChatEnd chat_end = text::ChatEnd::GenerationPrompt;
};

// Throws ApiError (400) naming the field for every wrong type, range or unsupported option.
ApiRequest parse_request(const Json& body, Endpoint endpoint, const ImagePolicy& images);
// The body as JSON (malformed, too deep, duplicate keys → 400).
Json parse_body(std::string_view body);

// POST /tokenize (vLLM's contract): "prompt" (text as /v1/completions reads it) or "messages"
// (the chat template, images expanded into their soft tokens), "add_special_tokens" (prompt: the
// leading <bos>, default true; messages: only false, the template has its own),
// "add_generation_prompt" and "continue_final_message" (messages: as on the chat endpoint),
// "return_token_strs".
struct TokenizeRequest {
  ApiRequest request;  // Completion for a prompt, Chat for messages
  bool add_special_tokens = true;
  bool return_token_strs = false;
};
TokenizeRequest parse_tokenize(const Json& body, const ImagePolicy& images);
// POST /detokenize: {"model", "tokens": [ids]} (ids range-checked against the vocabulary by the
// caller).
struct DetokenizeRequest {
  std::string model;  // empty = not given
  std::vector<int32_t> tokens;
};
DetokenizeRequest parse_detokenize(const Json& body);

// Base64 (RFC 4648, padding optional, no whitespace); nullopt when malformed.
std::optional<std::vector<uint8_t>> base64_decode(std::string_view s);

// Response building. One generated token as the client sees it.
struct TokenOut {
  int32_t id = 0;
  std::string text;    // what the detokenizer emitted for it (may be empty mid-character)
  std::string piece;   // the token's own text (logprobs "token")
  float logprob = 0.f;
  std::vector<std::pair<std::string, float>> top;  // top alternatives (piece, logprob)
  bool unscored = false;  // the prompt's first token (echo): nothing before it, logprob null
};

struct UsageOut {
  int prompt_tokens = 0, completion_tokens = 0, image_tokens = 0, cached_tokens = 0;
};

struct ResponseMeta {
  std::string id;          // chatcmpl-… / cmpl-…
  int64_t created = 0;     // Unix seconds
  std::string model;
  std::string fingerprint; // system_fingerprint: the compatibility identity hash
};

// A function call of an answer (OpenAI's tool_calls[i], type "function").
struct ToolCall {
  std::string id, name;
  std::string arguments;  // JSON text
};

// A piece of tool call `index` in a stream chunk (OpenAI's delta.tool_calls[i]): the call's id and
// name with its first piece only, then more of its arguments' text.
struct ToolCallDelta {
  size_t index = 0;
  std::string id, name;
  std::string arguments;
};

// One choice of a response, or what a stream chunk carries of it. Choices are numbered prompt by
// prompt, n each (OpenAI's and vLLM's order for a list of prompts).
struct ChoiceOut {
  int index = 0;
  std::string text;
  std::vector<TokenOut> tokens;                  // with logprobs
  std::optional<std::vector<int32_t>> token_ids; // return_token_ids
  std::vector<ToolCall> tool_calls;              // chat: in place of the text
  std::vector<ToolCallDelta> call_deltas;        // chat stream chunks: pieces of tool calls
  std::string finish;                            // empty: not finished (chunks)
  engine::StopReason stop_reason;  // with a finish: vLLM's stop_reason (a string, an id or null)
};

Json usage_json(const UsageOut& u);
// OpenAI's token logprobs, [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]: a
// chat choice's logprobs.content, a Responses output_text's logprobs.
Json logprob_list(const std::vector<TokenOut>& tokens);
// Non-streamed bodies: every choice whole, with its tokens (logprobs) and finish reason.
Json chat_response(const ResponseMeta& m, const std::vector<ChoiceOut>& choices, bool logprobs, const UsageOut& u);
Json completion_response(const ResponseMeta& m, const std::vector<ChoiceOut>& choices, bool logprobs,
                         const UsageOut& u);
// Stream chunks (chat.completion.chunk / text_completion), one choice each. `usage_null` adds
// "usage": null as openai-node's include_usage contract wants on every chunk but the last.
Json chat_role_chunk(const ResponseMeta& m, int index, bool usage_null);
Json chat_delta_chunk(const ResponseMeta& m, const ChoiceOut& c, bool logprobs, bool usage_null);
Json completion_chunk(const ResponseMeta& m, const ChoiceOut& c, bool logprobs, bool usage_null);
Json usage_chunk(const ResponseMeta& m, Endpoint endpoint, const UsageOut& u);

// JSON text for the wire: invalid UTF-8 becomes U+FFFD instead of throwing.
std::string dump(const Json& j);
// One server-sent event: "data: <json>\n\n".
std::string sse(const Json& j);

}  // namespace vlm::server
