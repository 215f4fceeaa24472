// libFuzzer target: a whole GGUF model file through the Gemma 3 loader (models/gemma3/registry.h:
// open_checkpoint, text part): header, metadata config, canonical names, block formats and the
// registry's shapes. Each input is written to a scratch file, as a user's file is mapped.
// Must hold: the loader returns a checkpoint whose every tensor has the registry's shape and lies
// inside the file with the bytes its format and shape need, whose norms read as finite-or-not
// floats without faults; or it throws vlm::Error.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "io/checkpoint.h"
#include "kernels/format.h"
#include "models/gemma3/registry.h"

namespace {

const std::filesystem::path& scratch() {
  static const std::filesystem::path p =
      std::filesystem::temp_directory_path() / ("fuzz_gguf_model." + std::to_string(::getpid()) + ".gguf");
  return p;
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_gguf_model: check failed: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  {
    std::ofstream f(scratch(), std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  }
  try {
    const vlm::Checkpoint ck =
        vlm::models::gemma3::open_checkpoint(scratch(), vlm::Parts{.text = true, .vision = false});
    for (const vlm::TensorSpec& spec : vlm::models::gemma3::tensor_registry(ck.config())) {
      const vlm::TensorView* v = ck.find(spec.name);
      if (!v) {
        check(!spec.required, "a required tensor is missing");
        continue;
      }
      check(v->shape == spec.shape, "a tensor's shape is not the registry's");
      const size_t cols = size_t(v->shape.back()), rows = size_t(v->numel()) / cols;
      check(v->nbytes == rows * vlm::kernels::format_of(v->dtype).row_bytes(cols), "a tensor's bytes do not fit its shape");
      // Touch the first and last byte: both must be mapped.
      volatile std::byte sink = v->data[0];
      sink = v->data[v->nbytes - 1];
      (void)sink;
      if (v->shape.size() == 1) (void)v->to_f32();  // norms (w = stored - 1 for GGUF)
    }
  } catch (const vlm::Error&) {
  }
  return 0;
}
