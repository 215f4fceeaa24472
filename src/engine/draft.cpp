#include "engine/draft.h"

#include <algorithm>
#include <cmath>

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

void DraftOdds::pick(std::vector<int32_t>& lookup, double row_cost) {
  const size_t k = length(lookup.size(), row_cost);
  unchecked_ = k == 0 && !lookup.empty() ? lookup[0] : -1;
  lookup.resize(k);
}

size_t agreed(std::span<const int32_t> draft, std::span<const int32_t> draws) {
  size_t n = 0;
  while (n < draft.size() && n < draws.size() && draws[n] == draft[n]) ++n;
  return n;
}

size_t DraftOdds::drawn(std::span<const int32_t> checked, std::span<const int32_t> draws) {
  const size_t taken = agreed(checked, draws);
  if (!checked.empty()) record(checked.size(), taken);
  else if (unchecked_ >= 0 && !draws.empty()) record(1, draws[0] == unchecked_);
  unchecked_ = -1;
  return taken;
}

size_t DraftOdds::length(size_t max, double row_cost) const {
  const double p = taken_ / ids_;
  size_t best = 0;
  double best_rate = 1, gain = 1, pk = 1;  // ids per step's time; 1 + p + … + p^k; p^k
  for (size_t k = 1; k <= max; ++k) {
    pk *= p;
    gain += pk;
    const double rate = gain / (1 + row_cost * double(k));
    if (rate > best_rate) best = k, best_rate = rate;
  }
  return best;
}

void DraftOdds::record(size_t checked, size_t taken) {
  const size_t n = std::min(checked, taken + 1);
  const double keep = std::pow(kDraftOddsDecay, double(n));
  ids_ = ids_ * keep + double(n);
  taken_ = taken_ * keep + double(taken);
}

void RowCost::pass(size_t rows, double seconds) {
  const double r = double(rows);
  w_ = w_ * kRowCostDecay + 1;
  r_ = r_ * kRowCostDecay + r;
  rr_ = rr_ * kRowCostDecay + r * r;
  t_ = t_ * kRowCostDecay + seconds;
  rt_ = rt_ * kRowCostDecay + r * seconds;
}

double RowCost::value() const {
  // Rows must vary (a spread of at least a quarter row) for the slope to mean anything.
  const double var = w_ * rr_ - r_ * r_;
  if (w_ <= 0 || var < 0.0625 * w_ * w_) return prior_;
  const double b = (w_ * rt_ - r_ * t_) / var, a = (t_ - b * r_) / w_;
  if (!(a + b > 0)) return prior_;
  const double fit = std::clamp(b / (a + b), 0.02, 1.0);
  return (w_ * fit + kRowCostPriorPasses * prior_) / (w_ + kRowCostPriorPasses);
}

double batch_row_cost(double one, size_t rows) {
  const double r = double(std::max<size_t>(rows, 1));
  return one * r / (1 + one * (r - 1));
}

}  // namespace vlm::engine
