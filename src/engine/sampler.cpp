#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "kernels/ops.h"

namespace vlm {

void validate(const SamplingParams& p) {
  if (!(p.temperature >= 0.f) || !std::isfinite(p.temperature))
    fail("temperature must be >= 0, got {}", p.temperature);
  if (p.top_k < 0) fail("top_k must be >= 0, got {}", p.top_k);
  if (!(p.top_p > 0.f && p.top_p <= 1.f)) fail("top_p must be in (0, 1], got {}", p.top_p);
  if (!(p.min_p >= 0.f && p.min_p <= 1.f)) fail("min_p must be in [0, 1], got {}", p.min_p);
  if (!(p.repetition_penalty > 0.f) || !std::isfinite(p.repetition_penalty))
    fail("repetition_penalty must be > 0, got {}", p.repetition_penalty);
  if (!std::isfinite(p.presence_penalty)) fail("presence_penalty must be finite");
  if (!std::isfinite(p.frequency_penalty)) fail("frequency_penalty must be finite");
  if (p.vocab_limit < 0) fail("vocab_limit must be >= 0, got {}", p.vocab_limit);
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0 || (p.vocab_limit > 0 && id >= p.vocab_limit))
      fail("logit_bias: token id {} is outside the vocabulary [0, {})", id, p.vocab_limit);
    if (!(bias >= -100.f && bias <= 100.f)) fail("logit_bias: the bias of token {} must be in [-100, 100]", id);
  }
}

namespace {

// The largest value; NaN is passed over unless x[0] is NaN (then NaN), as max_element's
// comparisons do. Sixteen running maxima instead of one: the single chain ran at 14 cycles a value
// (0.93 ms for Gemma 3's 262208 logits, each step's token waiting on it).
float max_of(std::span<const float> x) {
  float m[16];
  std::fill(std::begin(m), std::end(m), x[0]);
  size_t i = 0;
  for (; i + 16 <= x.size(); i += 16)
    for (size_t j = 0; j < 16; ++j) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
  float best = m[0];
  for (float v : m) best = v > best ? v : best;
  for (; i < x.size(); ++i) best = x[i] > best ? x[i] : best;
  return best;
}

// A logit as an unsigned key in the same order, NaN lowest and -0 as 0 (they tie in the ranking).
uint32_t ordered(float x) {
  if (x != x) return 0;
  if (x == 0.f) x = 0.f;
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u & 0x80000000u ? ~u : u | 0x80000000u;
}

// The ids in the order a draw walks them (logit descending, ties by id), and their weights
// exp(l / T - top / T), sorted a band at a time: a draw seldom goes past the first tokens, and
// sorting all of Gemma 3's 262208 ids took 31 ms a token. Bands are runs of histogram bins of
// the logits from the top, each band holding about as many ids as all before it, so the ids
// sorted are at most about twice those asked for. Entries sort as one integer each: the
// inverted key, then the id.
class Ranking {
 public:
  // Callers ask for ranks below `need` only.
  Ranking(std::span<const float> logits, float top, float temperature, size_t need)
      : logits_(logits), t_(double(temperature)), mx_(double(top) / double(temperature)), need_(need) {
    // The bins span weights down to e^-kSpan of the top's; the last bin holds the rest, and with
    // a non-finite top every id (the engine refuses non-finite logits before sampling).
    if (std::isfinite(top))
      top_ = top, scale_ = float(std::min(double(kBins) / (kSpan * t_), double(std::numeric_limits<float>::max())));
    count_.assign(kBins + 1, 0);
    bins_.resize(logits.size());
    for (size_t id = 0; id < logits.size(); ++id) ++count_[bins_[id] = uint16_t(bin(logits[id]))];
  }

  int32_t id(size_t i) { return int32_t(at(i) & 0xffffffffu); }
  double weight(size_t i) {
    at(i);
    return weight_[i];
  }

 private:
  static constexpr size_t kBins = 4096;
  static constexpr double kSpan = 64;

  // Larger logits take lower bins; NaN the last (the comparison is false).
  size_t bin(float x) const {
    const float b = (top_ - x) * scale_;
    return size_t(b < float(kBins) ? b : float(kBins));
  }

  uint64_t at(size_t i) {
    while (i >= order_.size()) {
      if (next_bin_ > kBins) fail("sampler: rank {} past the {} ranked", i, order_.size());
      next_band();
    }
    return order_[i];
  }

  void next_band() {
    const size_t first = order_.size(), lo = next_bin_;
    size_t band = 0;
    while (next_bin_ <= kBins && (band == 0 || band < std::max<size_t>(first, 64))) band += count_[next_bin_++];
    for (size_t id = 0; id < logits_.size(); ++id)
      if (bins_[id] >= lo && bins_[id] < next_bin_) order_.push_back(uint64_t(~ordered(logits_[id])) << 32 | id);
    const auto begin = order_.begin() + std::ptrdiff_t(first);
    if (order_.size() >= need_) {  // only the first need_ ranks are asked for
      std::nth_element(begin, order_.begin() + std::ptrdiff_t(need_), order_.end());
      order_.resize(need_);
      next_bin_ = kBins + 1;
    }
    std::sort(begin, order_.end());
    for (size_t i = first; i < order_.size(); ++i)
      weight_.push_back(std::exp(double(logits_[order_[i] & 0xffffffffu]) / t_ - mx_));
  }

  std::span<const float> logits_;
  float top_ = 0, scale_ = 0;
  double t_, mx_;
  size_t need_;
  std::vector<uint32_t> count_;  // ids per bin
  std::vector<uint16_t> bins_;   // each id's bin
  size_t next_bin_ = 0;          // order_ holds the ids of every bin below this
  std::vector<uint64_t> order_;
  std::vector<double> weight_;
};

}  // namespace

int32_t argmax(std::span<const float> x) {
  if (x.empty()) fail("argmax of no values");
  const float m = max_of(x);
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i] == m) return int32_t(i);
  return 0;  // x[0] is NaN
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) { validate(p); }

void Sampler::add_prompt(std::span<const int32_t> ids) {
  for (int32_t id : ids) ++seen_[id];
}

double Sampler::uniform() { return double(rng_() >> 11) * 0x1.0p-53; }

int32_t Sampler::sample(std::span<float> logits, TokenFilter* filter) {
  const size_t V = p_.vocab_limit > 0 ? std::min(logits.size(), size_t(p_.vocab_limit)) : logits.size();
  if (V == 0) fail("sampler: empty logits");
  if (p_.repetition_penalty != 1.f)
    for (const auto& [id, n] : seen_)
      if (size_t(id) < V) {
        float& x = logits[size_t(id)];
        x = x > 0.f ? x / p_.repetition_penalty : x * p_.repetition_penalty;
      }
  if (p_.presence_penalty != 0.f || p_.frequency_penalty != 0.f)
    for (const auto& [id, n] : generated_)
      if (size_t(id) < V) logits[size_t(id)] -= p_.frequency_penalty * float(n) + p_.presence_penalty;
  for (const auto& [id, bias] : p_.logit_bias)
    if (size_t(id) < V) logits[size_t(id)] += bias;

  const std::span<float> kept = logits.first(V);
  int32_t pick = -1;
  if (filter && p_.temperature == 0.f) pick = argmax(kept);
  if (filter && (pick < 0 || !filter->allows(pick))) {
    if (!filter->mask(kept)) fail("the response format allows no token of the vocabulary here");
    pick = -1;
  }
  if (pick < 0) pick = p_.temperature == 0.f ? argmax(kept) : draw(kept);
  // A draw's rounding can land on the last ranked id, which a mask may have set to -inf.
  if (filter && kept[size_t(pick)] == -std::numeric_limits<float>::infinity()) pick = argmax(kept);
  ++generated_[pick];
  ++seen_[pick];
  return pick;
}

// Temperature, then top-k, top-p and min-p over the weights w = exp((l - top) / T) (the top token's
// is 1) in ranked order, then a draw from what is kept. Only the ranked prefix that a rule or the
// draw reaches is sorted; without top-k the weights of all ids are summed once, in id order.
int32_t Sampler::draw(std::span<float> logits) {
  const size_t V = logits.size();
  const size_t n = p_.top_k > 0 && size_t(p_.top_k) < V ? size_t(p_.top_k) : V;
  const float top = max_of(logits);
  if (n == V && p_.top_p >= 1.f && p_.min_p <= 0.f) {
    // Nothing to rank: the walk in id order. A ranked walk over near-equal logits (a random
    // checkpoint's, or a real one's at a high temperature) sorted most of Gemma 3's 262208 ids:
    // 10-40 ms a token against about 0.1 ms here (docs/performance.md, "Sampling at temperature
    // 1"). The weights exp(l / T - top / T) replace the logits, in f32 on the vector path.
    const float inv_t = 1.f / p_.temperature;
    if (!std::isfinite(inv_t) || !std::isfinite(top * inv_t)) return argmax(logits);  // all weight on the top
    const double sum = kernels::scaled_exp(logits.data(), V, inv_t, nullptr);
    double r = uniform() * sum;
    int32_t last = -1;  // rounding can leave r past the end: the last id of weight > 0 then
    for (size_t i = 0; i < V; ++i) {
      if (r < logits[i]) return int32_t(i);
      r -= logits[i];
      if (logits[i] > 0.f) last = int32_t(i);
    }
    return last >= 0 ? last : argmax(logits);  // NaN among the logits: no weight compared
  }
  Ranking order(logits, top, p_.temperature, n);
  double sum = 0;
  if (n < V) {
    for (size_t i = 0; i < n; ++i) sum += order.weight(i);
  } else {
    const double t = double(p_.temperature), mx = double(top) / t;
    for (float l : logits) sum += std::exp(double(l) / t - mx);
  }
  // top-p: the shortest prefix whose mass reaches top_p (at least one token).
  size_t keep = n;
  double kept = sum;
  if (p_.top_p < 1.f) {
    kept = order.weight(0);
    keep = 1;
    while (keep < n && kept < double(p_.top_p) * sum) kept += order.weight(keep++);
  }
  // min-p: only tokens of at least min_p times the top token's weight (1).
  if (p_.min_p > 0.f) {
    size_t k = 1;
    kept = order.weight(0);
    for (; k < keep && order.weight(k) >= double(p_.min_p); ++k) kept += order.weight(k);
    keep = k;
  }
  double r = uniform() * kept;
  for (size_t i = 0; i + 1 < keep; ++i) {
    if (r < order.weight(i)) return order.id(i);
    r -= order.weight(i);
  }
  return order.id(keep - 1);
}

}  // namespace vlm
