// CLI11 validators shared by the subcommands.
#pragma once
#include <CLI/CLI.hpp>

#include <charconv>
#include <cstdint>
#include <string>

namespace vlm::cli {

// A decimal integer in [0, 2^64 − 1]. CLI11 2.1 converts unsigned options with strtoull,
// which wraps "-1" to 2^64 − 1, saturates values past 2^64 and reads "010" as octal.
inline CLI::Validator unsigned64() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        uint64_t v = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (s.empty() || ec != std::errc() || end != s.data() + s.size())
          return "expected an integer in [0, 18446744073709551615], got '" + s.substr(0, 32) +
                 (s.size() > 32 ? "…'" : "'");
        return {};
      },
      "UINT64");
}

}  // namespace vlm::cli
