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

// Reads the answer's JSON as it is written: the response's text decoded as far as whole
// characters and escapes go, each call once its name is whole (with a fresh id: "call_" and 24
// letters or digits, as OpenAI's) and its arguments' JSON text as the model writes it. A stream
// sends what is new at each step; read_tool_answer reads a whole answer the same way.
class ToolAnswerReader {
 public:
  struct Delta {
    std::string content;
    std::vector<ToolCallDelta> calls;
    bool empty() const { return content.empty() && calls.empty(); }
  };
  // Adds text of the answer; returns what it adds to the content and the calls.
  Delta feed(std::string_view text);
  // Feeds c's text, then gives c what the whole answer so far says: its calls (finish
  // "tool_calls" once the JSON is whole; a cut call keeps the arguments written so far, as
  // OpenAI's) or the response's text.
  void read(ChoiceOut& c);
  bool whole() const { return whole_; }  // the JSON object closed
  bool response() const { return response_; }  // the answer is {"response": ...}
  bool called() const { return whole_ && !calls_.empty(); }  // whole, with calls: finish "tool_calls"
  const std::string& content() const { return content_; }
  const std::vector<ToolCall>& calls() const { return calls_; }

 private:
  void parse();  // content_, calls_ and whole_ from text_ (calls keep their ids)
  size_t parse_calls(std::string_view s, size_t p);  // the list after its '[': past its ']', or npos
  std::string text_, content_;
  std::vector<ToolCall> calls_;
  bool whole_ = false, response_ = false;
  size_t content_sent_ = 0;
  std::vector<size_t> arguments_sent_;  // per call; a call is announced once it has an entry
};

// A finished choice whose text is the whole answer's JSON, read as OpenAI's (ToolAnswerReader::read).
void read_tool_answer(ChoiceOut& c);

// The text of earlier turns as the model wrote and reads them: an assistant's calls
// (arguments as the client sent them: JSON text, kept as a string where it does not parse), and
// a tool's result.
std::string tool_calls_text(const std::vector<ToolCall>& calls);
std::string tool_result_text(const std::string& name, const std::string& call_id, const std::string& content);

}  // namespace vlm::server
