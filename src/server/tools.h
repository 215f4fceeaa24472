// Tool calls for a model whose chat template has none (Gemma 3), in the JSON form llama.cpp uses
// for such templates (its "generic" format, common/chat.cpp): the functions are described in the
// system turn, and the answer is constrained (grammar/) to one JSON object, either
// {"tool_calls": [{"name": ..., "arguments": {...}}, ...]} or {"response": "..."}. The server
// turns that object into OpenAI's message.tool_calls or content, and earlier calls and their
// results in a conversation back into the same JSON text. docs/tool-calls.md.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/schema.h"
#include "server/protocol.h"

namespace vlm::server {

// A function the client offers (tools[i].function), its parameters checked to compile.
struct Function {
  std::string name, description;
  Json parameters;  // a JSON Schema of the arguments object
};

enum class ToolChoice { Auto, Required, Named };

// What a request with tools asks of the answer.
struct ToolUse {
  std::shared_ptr<const grammar::Schema> schema;  // the answer's one JSON object
  std::string instructions;                       // for the system turn
};

// `named`: the function tool_choice names (ToolChoice::Named); `parallel`: more than one call.
ToolUse tool_use(const std::vector<Function>& functions, ToolChoice choice, const std::string& named, bool parallel);

// A finished choice whose text is the answer's JSON, read as OpenAI's: its calls (each with a
// fresh id, arguments as JSON text; finish "tool_calls") or its response as the text. An answer
// that is not such JSON (cut by max_tokens or a stop string) stays as it is.
void read_tool_answer(ChoiceOut& c);

// The text of earlier turns as the model wrote and reads them: an assistant's calls
// (arguments as the client sent them: JSON text, kept as a string where it does not parse), and
// a tool's result.
std::string tool_calls_text(const std::vector<ToolCall>& calls);
std::string tool_result_text(const std::string& name, const std::string& call_id, const std::string& content);

}  // namespace vlm::server
