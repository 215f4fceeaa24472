// Strict JSON reading shared by the checkpoint loaders: bounded size and
// nesting, duplicate keys refused (nlohmann would silently keep the last one).
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace vlm {

// Parses `text`; errors start with `where` (the file name) and say what is wrong.
nlohmann::json parse_json(std::string_view text, const std::string& where, int max_depth = 32);
// The same, objects keeping their keys in the text's order (request bodies: a JSON Schema's
// properties are generated in the order they are written).
nlohmann::ordered_json parse_ordered_json(std::string_view text, const std::string& where, int max_depth = 32);

// `s` with control characters written as \xNN, so error messages stay on one line.
std::string printable(std::string_view s);
// printable(s), cut to about `max` characters ("…(N bytes)" appended when cut), for echoing
// input of any length in an error.
std::string shorten(std::string_view s, size_t max = 64);

}  // namespace vlm
