// Anthropic's Messages API (POST /v1/messages), which llama.cpp's server also offers, as the
// `@anthropic-ai/sdk` client types it: a request is read into the chat request it means (system,
// text and image blocks, tool_use and tool_result blocks, tools with input_schema), served as such,
// and answered as a Message or its event stream. docs/messages-api.md.
#pragma once
#include <string>
#include <vector>

#include "server/protocol.h"

namespace vlm::server {

struct MessagesRequest {
  ApiRequest chat;                  // what the request asks, as a chat request
  std::vector<std::string> origin;  // for each chat message, the field it came from ("messages[2]")
};

// Throws ApiError naming the Messages field (messages[1].content[0].source, max_tokens, ...).
MessagesRequest parse_anthropic(const Json& body, const ImagePolicy& images);

// An error about the chat request (also one found later) as the Messages request names the field.
void name_for_anthropic(ApiError& e, const std::vector<std::string>& origin);

// Anthropic's error body: {"type": "error", "error": {"type", "message"}}.
Json anthropic_error_json(const ApiError& e);

// A finished answer as Anthropic's Message.
struct MessageOut {
  std::string id;  // msg_…
  std::string model;
  std::string text;
  std::vector<ToolCall> calls;
  std::string stop_reason;    // end_turn, max_tokens, stop_sequence, tool_use
  std::string stop_sequence;  // with stop_sequence: the one that ended it
  int input_tokens = 0, output_tokens = 0, cached_tokens = 0;
};
// The tool_use id of a call (toolu_ and the call's own 24 characters).
std::string tool_use_id(const ToolCall& c);
// The Message's content blocks: its text (when there is any or nothing else), then its calls.
Json content_blocks(const MessageOut& m);
// The Message's stop_sequence: the one that ended it, or null.
Json stop_sequence_json(const MessageOut& m);
// The whole Message; `streaming_start`: the message_start event's (no content, no stop reason).
Json message_json(const MessageOut& m, bool streaming_start = false);

}  // namespace vlm::server
