// Next-token choice from one row of logits. Order: repetition penalty (HF: over the
// prompt and everything generated), presence/frequency penalties (OpenAI: over
// generated tokens), logit_bias (OpenAI: added to the logits), masking of ids ≥ vocab_limit,
// then greedy argmax when
// temperature is 0, else temperature → top-k → top-p → min-p → draw. The rules and the draw
// take the tokens ranked by logit, highest first (ties: lower id first); the draw walks the kept
// ones against u · (their mass). Only the ranked prefix they reach is sorted (sampler.cpp). With
// no rule to apply (no top-k, top-p 1, min-p 0: the OpenAI API's defaults) nothing is ranked and
// the draw walks every id in id order (the weights in f32): the same probabilities, another
// token for a given u.
// The draw uses its own 64-bit generator, so a seed gives the same tokens everywhere.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace vlm {

struct SamplingParams {
  float temperature = 0.f;  // 0 = greedy
  int top_k = 0;            // 0 = off
  float top_p = 1.f;        // 1 = off
  float min_p = 0.f;        // 0 = off
  float repetition_penalty = 1.f;
  float presence_penalty = 0.f;
  float frequency_penalty = 0.f;
  uint64_t seed = 0;
  int vocab_limit = 0;  // ids ≥ this are never sampled (0 = no limit); VLM vocab padding
  // Added to the logits of these ids (OpenAI's logit_bias: -100 all but bans one, 100 all but
  // forces it); ids outside the vocabulary are refused by the engine.
  std::vector<std::pair<int32_t, float>> logit_bias;
};

// Throws Error naming the parameter when out of range.
void validate(const SamplingParams& p);

// The index of the first largest value, as numpy/torch argmax (NaN is never largest unless
// x[0] is NaN; then 0). Throws on no values.
int32_t argmax(std::span<const float> x);

// Which tokens may come next (a response format's grammar); ids it refuses are never sampled.
class TokenFilter {
 public:
  virtual ~TokenFilter() = default;
  virtual bool allows(int32_t id) = 0;
  // Sets the logit of every refused id to -inf; false when it refuses them all.
  virtual bool mask(std::span<float> logits) = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // Records prompt tokens (repetition penalty only).
  void add_prompt(std::span<const int32_t> ids);
  // Picks a token from logits (modified in place) and records it as generated. With a filter,
  // the token the rules pick among the ids it allows (a greedy pick asks it about the argmax
  // first: the same token as masking, unless that is refused); throws Error when it allows none.
  int32_t sample(std::span<float> logits, TokenFilter* filter = nullptr);

 private:
  double uniform();  // [0, 1)
  int32_t draw(std::span<float> logits);  // temperature > 0

  SamplingParams p_;
  std::mt19937_64 rng_;
  std::unordered_map<int32_t, int> seen_;       // prompt + generated (repetition)
  std::unordered_map<int32_t, int> generated_;  // counts of generated tokens
};

}  // namespace vlm
