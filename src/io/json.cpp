#include "io/json.h"

#include <set>
#include <vector>

#include "core/error.h"

namespace vlm {

namespace {

template <class json>
json parse_as(std::string_view text, const std::string& where, int max_depth) {
  // One key set per open object, to refuse duplicate keys.
  std::vector<std::set<std::string>> keys;
  auto cb = [&](int depth, typename json::parse_event_t ev, json& parsed) {
    switch (ev) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth >= max_depth) fail("{}: JSON nested deeper than {} levels", where, max_depth);
        if (ev == json::parse_event_t::object_start) keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
        keys.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys.back().insert(parsed.template get<std::string>()).second)
          fail("{}: duplicate JSON key '{}'", where, printable(parsed.template get<std::string>()));
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), cb);
  } catch (const nlohmann::json::exception& e) {
    // Drop nlohmann's "[json.exception.parse_error.101] " tag; keep the position and reason.
    std::string msg = e.what();
    if (size_t p = msg.find("] "); msg.rfind("[json.exception", 0) == 0 && p != std::string::npos)
      msg = msg.substr(p + 2);
    fail("{}: not valid JSON: {}", where, msg);
  }
}

}  // namespace

nlohmann::json parse_json(std::string_view text, const std::string& where, int max_depth) {
  return parse_as<nlohmann::json>(text, where, max_depth);
}

nlohmann::ordered_json parse_ordered_json(std::string_view text, const std::string& where, int max_depth) {
  return parse_as<nlohmann::ordered_json>(text, where, max_depth);
}

std::string printable(std::string_view s) {
  std::string out;
  for (char c : s) {
    if ((unsigned char)c < 0x20 || c == 0x7f)
      out += fmt::format("\\x{:02x}", (unsigned char)c);
    else
      out += c;
  }
  return out;
}

std::string shorten(std::string_view s, size_t max) {
  if (s.size() <= max) return printable(s);
  return fmt::format("{}…({} bytes)", printable(s.substr(0, max)), s.size());
}

}  // namespace vlm
