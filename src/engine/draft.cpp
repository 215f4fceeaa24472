#include "engine/draft.h"

#include <algorithm>

namespace vlm::engine {

std::vector<int32_t> lookup_draft(std::span<const int32_t> ids, size_t max_tokens, int32_t vocab_limit) {
  const size_t L = ids.size();
  std::vector<int32_t> draft;
  if (max_tokens == 0) return draft;
  for (size_t n = std::min(kDraftNgramMax, L > 0 ? L - 1 : 0); n >= kDraftNgramMin; --n) {
    const std::span<const int32_t> tail = ids.subspan(L - n);
    for (size_t i = L - n; i-- > 0;) {  // an earlier start; the ids after it begin before the tail ends
      if (!std::equal(tail.begin(), tail.end(), ids.begin() + std::ptrdiff_t(i))) continue;
      // Past the end the copy reads its own ids: a repeating run goes on repeating.
      for (size_t j = i + n; draft.size() < max_tokens; ++j) {
        const int32_t id = j < L ? ids[j] : draft[j - L];
        if (id >= vocab_limit) break;
        draft.push_back(id);
      }
      if (!draft.empty()) return draft;  // else it ran into an image: an earlier one may not
    }
  }
  return draft;
}

}  // namespace vlm::engine
