// libFuzzer target: GGUF header validation on arbitrary file images.
// Any input must either parse into a self-consistent header or throw vlm::Error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "core/error.h"
#include "io/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  try {
    const vlm::GgufHeader h = vlm::parse_gguf(file, "fuzz.gguf");
    // What the parser promises callers: every tensor lies inside the file, whole blocks,
    // aligned; every view lies inside the file; typed getters only throw vlm::Error.
    if (h.data_offset + h.data_size != size) std::abort();
    for (const auto& t : h.tensors) {
      if (t.offset % h.alignment || t.offset + t.bytes > h.data_size) std::abort();
      if (t.ne[0] % vlm::ggml_traits(t.type).block_elems) std::abort();
    }
    for (const auto& kv : h.kvs) {
      for (std::string_view s : kv.strs)
        if (s.data() < reinterpret_cast<const char*>(data) || s.data() + s.size() > reinterpret_cast<const char*>(data) + size)
          std::abort();
      try {
        h.get_uint(kv.key);
      } catch (const vlm::Error&) {
      }
      try {
        h.get_i32_array(kv.key);
        h.get_f32_array(kv.key);
      } catch (const vlm::Error&) {
      }
    }
  } catch (const vlm::Error&) {
  }
  return 0;
}
