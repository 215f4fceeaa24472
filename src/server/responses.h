// OpenAI's Responses API (POST /v1/responses), as the `openai` clients' resources/responses type
// it: a request is read into the chat request it means (its input items as chat messages, its
// flat function tools as chat tools, text.format as response_format), which the rest of the server
// already serves; the answer is written back as a Response object, or streamed as its typed
// events. Nothing is stored: previous_response_id and background runs are refused.
// docs/responses-api.md.
#pragma once
#include <string>
#include <vector>

#include "server/protocol.h"

namespace vlm::server {

struct ResponsesRequest {
  ApiRequest chat;  // what the request asks, as a chat request
  Json echo;        // the request's settings as the Response object repeats them
  std::vector<std::string> origin;  // for each chat message, the field it came from ("input[2]")
};

// Throws ApiError naming the Responses field (input[3].content[0].image_url, text.format.schema,
// max_output_tokens, ...).
ResponsesRequest parse_responses(const Json& body, const ImagePolicy& images);

// An error about the chat request (one found later: an image that does not decode, a prompt over
// the context) as the Responses request names the field, in its param and message.
void name_for_responses(ApiError& e, const std::vector<std::string>& origin);

// One finished (or failed) answer: its text or calls, why it ended, its tokens.
struct ResponseOut {
  std::string id;              // resp_…
  int64_t created = 0;
  std::string model;
  std::string text;            // the message's text, when there are no calls
  std::vector<TokenOut> tokens;  // with logprobs: the message's tokens
  std::vector<ToolCall> calls;
  bool incomplete = false;     // max_output_tokens ended it
  UsageOut usage;
};

// Item ids of a response: its message and each call, derived from the response's id.
std::string message_id(const std::string& response_id);
std::string call_item_id(const std::string& response_id, size_t k);
// Output item k of a response, a function call (status completed).
Json function_call_item(const std::string& response_id, size_t k, const ToolCall& c);

// The Response object: `status` "in_progress" (streaming's first events, no output yet),
// "completed" or "incomplete".
Json response_json(const ResponseOut& r, const Json& echo, const std::string& status);
// The output items of a finished answer: one message, or one function_call item a call.
Json output_items(const ResponseOut& r);

// One streamed event: "event: <type>\ndata: <json>\n\n", the json's "type" and "sequence_number"
// set (`seq` counts the response's events).
std::string event(Json e, const char* type, int& seq);

}  // namespace vlm::server
