#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"

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
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) { validate(p); }

void Sampler::add_prompt(std::span<const int32_t> ids) {
  for (int32_t id : ids) ++seen_[id];
}

double Sampler::uniform() { return double(rng_() >> 11) * 0x1.0p-53; }

int32_t Sampler::sample(std::span<float> logits) {
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

  int32_t pick;
  if (p_.temperature == 0.f) {
    // First maximum, as numpy/torch argmax.
    pick = int32_t(std::max_element(logits.begin(), logits.begin() + std::ptrdiff_t(V)) - logits.begin());
  } else {
    std::vector<int32_t> idx(V);
    std::iota(idx.begin(), idx.end(), 0);
    auto by_logit = [&](int32_t a, int32_t b) {
      return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
    };
    size_t n = V;
    if (p_.top_k > 0 && size_t(p_.top_k) < n) {
      std::partial_sort(idx.begin(), idx.begin() + p_.top_k, idx.end(), by_logit);
      n = size_t(p_.top_k);
    } else {
      std::sort(idx.begin(), idx.end(), by_logit);
    }
    std::vector<double> prob(n);
    const double mx = double(logits[size_t(idx[0])]) / p_.temperature;
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += prob[i] = std::exp(double(logits[size_t(idx[i])]) / p_.temperature - mx);
    for (double& x : prob) x /= sum;
    // top-p: the smallest prefix whose mass reaches top_p (at least one token).
    if (p_.top_p < 1.f) {
      double acc = 0;
      size_t keep = 0;
      while (keep < n && acc < double(p_.top_p)) acc += prob[keep++];
      n = std::max<size_t>(keep, 1);
    }
    // min-p: drop tokens below min_p times the top probability.
    if (p_.min_p > 0.f) {
      const double floor = double(p_.min_p) * prob[0];
      size_t keep = 1;
      while (keep < n && prob[keep] >= floor) ++keep;
      n = keep;
    }
    double total = 0;
    for (size_t i = 0; i < n; ++i) total += prob[i];
    double r = uniform() * total;
    pick = idx[n - 1];
    for (size_t i = 0; i < n; ++i) {
      if (r < prob[i]) {
        pick = idx[i];
        break;
      }
      r -= prob[i];
    }
  }
  ++generated_[pick];
  ++seen_[pick];
  return pick;
}

}  // namespace vlm
