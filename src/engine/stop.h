// Stop strings in streamed text.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace vlm {

// Finds stop strings in streamed text. Text that could still be the start of a stop
// string is held back, so nothing past a stop string is ever emitted.
class StopStrings {
 public:
  // `include`: the matched stop string stays in the text (vLLM's include_stop_str_in_output).
  explicit StopStrings(std::vector<std::string> stops, bool include = false);
  // Adds a piece; returns the text now safe to emit. After a match, stopped() is true and the
  // returned text ends right before the stop string (right after it with `include`). Unless `armed`,
  // the piece cannot complete a match (vLLM's min_tokens: a stop string must end in text that
  // comes once the answer may stop; it may begin earlier).
  std::string feed(std::string_view piece, bool armed = true);
  // Everything still held back (at the end of generation without a match).
  std::string flush();
  bool stopped() const { return !matched_.empty(); }
  const std::string& matched() const { return matched_; }  // the stop string found, once stopped

 private:
  std::vector<std::string> stops_;
  bool include_ = false;
  std::string held_;
  size_t quiet_ = 0;  // a match must end past this many bytes of held_ (the text fed unarmed)
  std::string matched_;
};

}  // namespace vlm
