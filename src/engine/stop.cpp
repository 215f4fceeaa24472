#include "engine/stop.h"

#include <algorithm>

namespace vlm {

StopStrings::StopStrings(std::vector<std::string> stops, bool include) : stops_(std::move(stops)), include_(include) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string StopStrings::feed(std::string_view piece, bool armed) {
  if (stopped()) return {};
  held_ += piece;
  if (!armed) quiet_ = held_.size();
  // The earliest match that ends in armed text.
  size_t first = std::string::npos;
  const std::string* hit = nullptr;
  for (const std::string& s : stops_) {
    const size_t p = held_.find(s, quiet_ >= s.size() ? quiet_ - s.size() + 1 : 0);
    if (p < first) first = p, hit = &s;
  }
  if (hit) {
    matched_ = *hit;
    std::string out = held_.substr(0, first + (include_ ? hit->size() : 0));
    held_.clear();
    return out;
  }
  // Keep the longest tail that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& s : stops_)
    for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n)
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
  const size_t out_bytes = held_.size() - keep;
  std::string out = held_.substr(0, out_bytes);
  held_.erase(0, out_bytes);
  quiet_ = quiet_ > out_bytes ? quiet_ - out_bytes : 0;
  return out;
}

std::string StopStrings::flush() {
  std::string out;
  if (!stopped()) out.swap(held_);
  return out;
}

}  // namespace vlm
