// Strict JSON reading shared by the checkpoint loaders: bounded size and
// nesting, duplicate keys refused (nlohmann would silently keep the last one).
#pragma once
#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace vlm {

// Parses `text`; errors start with `where` (the file name) and say what is wrong.
nlohmann::json parse_json(std::string_view text, const std::string& where, int max_depth = 32);

// `s` with control characters written as \xNN, so error messages stay on one line.
std::string printable(std::string_view s);

// Reads a whole (small) file; refuses files larger than max_bytes.
std::string read_text_file(const std::filesystem::path& path, size_t max_bytes = 64u << 20);

}  // namespace vlm
