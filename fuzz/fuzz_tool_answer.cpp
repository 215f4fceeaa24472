// libFuzzer target: a tool answer's text (server/tools.h), as a model under the tool-call grammar
// writes it or not at all. Input: a byte choosing the piece size (1..16), then the text. Fed in
// pieces, ToolAnswerReader's deltas add up to read_tool_answer's reading of the whole text (calls,
// ids aside, and content); a call's first piece carries its name, its later ones only arguments;
// and the calls of a whole answer (a JSON object, whatever follows it) have JSON arguments.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "server/tools.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t piece = 1 + data[0] % 16;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  vlm::server::ToolAnswerReader reader;
  std::string content;
  std::vector<vlm::server::ToolCall> calls;
  for (size_t p = 0; p < text.size(); p += piece) {
    const auto d = reader.feed(std::string_view(text).substr(p, piece));
    content += d.content;
    for (const auto& c : d.calls) {
      if (!c.id.empty()) {
        if (c.index != calls.size()) std::abort();
        calls.push_back({c.id, c.name, {}});
      } else if (c.index >= calls.size() || c.arguments.empty() || !c.name.empty()) {
        std::abort();
      }
      calls[c.index].arguments += c.arguments;
    }
  }
  vlm::server::ChoiceOut whole;
  whole.text = text;
  vlm::server::read_tool_answer(whole);
  if (whole.tool_calls.size() != calls.size() || (calls.empty() && whole.text != content)) std::abort();
  for (size_t k = 0; k < calls.size(); ++k)
    if (whole.tool_calls[k].name != calls[k].name || whole.tool_calls[k].arguments != calls[k].arguments)
      std::abort();
  if (reader.whole())
    for (const auto& c : calls)
      if (!c.arguments.empty() && !nlohmann::json::accept(c.arguments)) std::abort();  // "": none given
  return 0;
}
