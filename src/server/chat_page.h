// The chat page served at GET /: one self-contained HTML file (no external assets),
// src/server/chat.html, compiled into the binary by CMake.
#pragma once
#include <string_view>

namespace vlm::server {

std::string_view chat_page();

}  // namespace vlm::server
