// libFuzzer target: safetensors header validation on arbitrary file images.
// Any input must either parse into a self-consistent header or throw vlm::Error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "core/error.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  try {
    const vlm::SafetensorsHeader h = vlm::parse_safetensors(file, "fuzz.safetensors");
    // What the parser promises callers: every tensor lies inside the file.
    for (const auto& t : h.tensors)
      if (t.begin > t.end || h.data_offset + t.end > size) std::abort();
  } catch (const vlm::Error&) {
  }
  return 0;
}
