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
  explicit StopStrings(std::vector<std::string> stops);
  // Adds a piece; returns the text now safe to emit. After a match, stopped() is true
  // and the returned text ends right before the stop string.
  std::string feed(std::string_view piece);
  // Everything still held back (at the end of generation without a match).
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace vlm
