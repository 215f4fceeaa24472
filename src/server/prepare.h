// From a parsed API request to an engine::Request, with every check that can fail done here,
// before admission: images decoded (format sniffed from the bytes, sizes capped), the prompt
// built by the model's chat template, its length against the context, sampling defaults from
// the checkpoint's generation_config.json for the fields the request left out. Every failure is
// an ApiError with a 4xx status naming the field; nothing here runs the model.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>

#include "engine/model.h"
#include "engine/sequence.h"
#include "server/protocol.h"
#include "vision/image.h"

namespace vlm::server {

// generation_config.json's sampling fields (HF GenerationConfig): do_sample false means greedy.
struct GenerationDefaults {
  bool do_sample = false;
  float temperature = 1.f, top_p = 1.f, min_p = 0.f, repetition_penalty = 1.f;
  int top_k = 0;
};
// Reads DIR/generation_config.json when present (absent: greedy, as HF without the file).
GenerationDefaults load_generation_defaults(const std::filesystem::path& dir);

struct PrepareLimits {
  vision::DecodeLimits decode;  // per image
};

// The request's prompt ids (chat template or raw prompt, images decoded and expanded); fails with
// ApiError. `r.images` are consumed into `images`.
std::vector<int32_t> prompt_ids(const engine::Model& model, ApiRequest& r, const PrepareLimits& limits,
                                std::vector<vision::RgbImage>& images);

// Fails with ApiError; `r.images` are consumed.
engine::Request prepare_request(const engine::Model& model, ApiRequest& r, const GenerationDefaults& defaults,
                                const PrepareLimits& limits);

}  // namespace vlm::server
