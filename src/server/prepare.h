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

// The request's images, decoded; fails with ApiError. `r.images` are consumed.
std::vector<vision::RgbImage> request_images(const engine::Model& model, ApiRequest& r, const PrepareLimits& limits);

// Prompt `i` of the request as ids (chat: the template over its messages, the only prompt), its
// images expanded into their soft tokens; fails with ApiError.
std::vector<int32_t> prompt_ids(const engine::Model& model, const ApiRequest& r, size_t i,
                                const std::vector<vision::RgbImage>& images);

// One engine request per choice, prompt by prompt, n each (ChoiceOut's order). With a seed,
// choice j of a prompt samples with seed + j (vLLM's parallel sampling: choice 0 is what n = 1
// gives); without, each draws its own. Fails with ApiError; `r.images` are consumed.
std::vector<engine::Request> prepare_requests(const engine::Model& model, ApiRequest& r,
                                              const GenerationDefaults& defaults, const PrepareLimits& limits);

}  // namespace vlm::server
