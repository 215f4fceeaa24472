// libFuzzer target: a JSON Schema and bytes against it. Input: a u16 length L (little-endian), L
// bytes of schema text, then the bytes to feed. The schema compiles or throws vlm::Error; the
// matcher takes a prefix of the bytes, keeps at most kMaxReadings readings, and every prefix it
// calls complete is JSON that nlohmann parses.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/error.h"
#include "grammar/matcher.h"
#include "io/json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t n = std::min(size - 2, size_t(data[0] | data[1] << 8));
  const std::string_view schema_text(reinterpret_cast<const char*>(data + 2), n);
  const std::string_view bytes(reinterpret_cast<const char*>(data + 2 + n), size - 2 - n);
  std::shared_ptr<const vlm::grammar::Schema> schema;
  try {
    schema = vlm::grammar::Schema::compile(vlm::parse_ordered_json(schema_text, "schema", 64));
  } catch (const vlm::Error&) {
    return 0;
  }
  vlm::grammar::Matcher m(schema);
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (!m.feed(uint8_t(bytes[i]))) break;
    if (m.state().ends.size() > size_t(vlm::grammar::kMaxReadings)) std::abort();
    if (m.complete() && !nlohmann::json::accept(bytes.substr(0, i + 1))) std::abort();
  }
  return 0;
}
