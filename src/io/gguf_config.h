// ModelConfig from GGUF metadata: a Gemma 3 text file (general.architecture = gemma3) and,
// optionally, its mmproj file (clip, projector gemma3). docs/gguf.md docs/gemma3/prompt.md, docs/gemma3/preprocessing.md, docs/gemma3/vision.md#projector list the
// keys; what llama.cpp does not store it supplies by its fixed gemma3 rules, and so does this:
// a global layer every 6th (layer i is sliding iff i % 6 < 5), local RoPE base 10000, and the
// attention scale 1/sqrt(key_length) (1/sqrt(hidden/heads) for the 62-layer model).
#pragma once
#include "io/config.h"
#include "io/gguf.h"

namespace vlm {

// Throws vlm::Error naming the file and key for a missing key, a wrong type or an
// architecture other than gemma3 / clip+gemma3, and when the mmproj's projection_dim is not
// the text model's hidden size.
ModelConfig config_from_gguf(const GgufHeader& text, const GgufHeader* mmproj = nullptr);

}  // namespace vlm
