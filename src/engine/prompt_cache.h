// Saved prefills (`vlm run --prompt-cache FILE`) and identity stamps. Anything saved
// for a model carries its compatibility identity (io/identity.h) and is refused, with
// the differing fields named, when loaded under another identity: another checkpoint,
// mask mode, scaling policy or layout would make the saved numbers wrong.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "models/kv_cache.h"
#include "io/identity.h"
#include "vision/image.h"

namespace vlm {

// What a saved prefill is valid for besides the identity: the prompt ids and every
// image's pixels (equal ids can hold different images).
uint64_t request_hash(std::span<const int32_t> ids, const std::vector<vision::RgbImage>& images);

// The KV cache after the prompt (its `length` positions) and the logits of the last
// prompt row, so generation resumes without the vision tower or the prefill.
void save_prompt_cache(const std::filesystem::path& file, const Identity& id, uint64_t request,
                       const TextConfig& cfg, KvCache& cache, std::span<const float> last_logits);

struct SavedPrefill {
  KvCache cache;
  std::vector<float> logits;
};
// nullopt when the file holds another request (a miss: recompute and save again).
// Fails on another identity (naming the fields) and on a malformed or truncated file.
std::optional<SavedPrefill> load_prompt_cache(const std::filesystem::path& file, const Identity& id,
                                              uint64_t request, const TextConfig& cfg, int64_t context,
                                              DType kv, int vocab);

}  // namespace vlm
