// Sampler rules on hand-made logits, stop-string streaming, and seeds.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "core/error.h"
#include "engine/stop.h"
#include "engine/sampler.h"

namespace vlm {
namespace {

std::vector<float> logits_of(std::vector<float> v) { return v; }

TEST(Sampler, GreedyTakesFirstMaximum) {
  Sampler s({});
  auto l = logits_of({0.f, 3.f, 1.f, 3.f});
  EXPECT_EQ(s.sample(l), 1);
}

TEST(Sampler, VocabLimitMasksPadding) {
  SamplingParams p;
  p.vocab_limit = 3;
  Sampler s(p);
  auto l = logits_of({0.f, 1.f, 0.5f, 9.f, 9.f});
  EXPECT_EQ(s.sample(l), 1);
  p.temperature = 1.f;
  Sampler t(p);
  for (int i = 0; i < 200; ++i) {
    auto m = logits_of({0.f, 1.f, 0.5f, 9.f, 9.f});
    EXPECT_LT(t.sample(m), 3);
  }
}

TEST(Sampler, RepetitionPenaltyDividesPositiveMultipliesNegative) {
  SamplingParams p;
  p.repetition_penalty = 2.f;
  Sampler s(p);
  const int32_t prompt[] = {0, 2};
  s.add_prompt(prompt);
  // 0: 3 -> 1.5; 1: 2 stays; 2: -1 -> -2. Greedy picks 1.
  auto l = logits_of({3.f, 2.f, -1.f});
  EXPECT_EQ(s.sample(l), 1);
  EXPECT_FLOAT_EQ(l[0], 1.5f);
  EXPECT_FLOAT_EQ(l[2], -2.f);
}

TEST(Sampler, PresenceAndFrequencyPenaltiesCountGeneratedTokens) {
  SamplingParams p;
  p.frequency_penalty = 1.f;
  p.presence_penalty = 0.5f;
  Sampler s(p);
  auto a = logits_of({5.f, 4.f});
  EXPECT_EQ(s.sample(a), 0);  // nothing generated yet
  auto b = logits_of({5.f, 4.f});
  EXPECT_EQ(s.sample(b), 1);  // 5 - 1 - 0.5 = 3.5 < 4
  EXPECT_FLOAT_EQ(b[0], 3.5f);
}

TEST(Sampler, TopKOneAndTinyTopPAreGreedy) {
  for (int variant = 0; variant < 3; ++variant) {
    SamplingParams p;
    p.temperature = 1.5f;
    p.seed = 7;
    if (variant == 0) p.top_k = 1;
    if (variant == 1) p.top_p = 1e-6f;
    if (variant == 2) p.min_p = 0.999f;
    Sampler s(p);
    for (int i = 0; i < 50; ++i) {
      auto l = logits_of({0.1f, 0.3f, 0.2f, 0.25f});
      EXPECT_EQ(s.sample(l), 1) << variant;
    }
  }
}

TEST(Sampler, TopKAndTopPRestrictTheSupport) {
  SamplingParams p;
  p.temperature = 1.f;
  p.top_k = 2;
  Sampler s(p);
  std::map<int, int> seen;
  for (int i = 0; i < 500; ++i) {
    auto l = logits_of({1.f, 3.f, 2.9f, 0.f});
    ++seen[s.sample(l)];
  }
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_GT(seen[1], 0);
  EXPECT_GT(seen[2], 0);
  // top_p 0.6 over probabilities {0.5, 0.3, 0.2}: keeps the first two (mass 0.8 ≥ 0.6).
  SamplingParams q;
  q.temperature = 1.f;
  q.top_p = 0.6f;
  Sampler t(q);
  seen.clear();
  for (int i = 0; i < 500; ++i) {
    auto l = logits_of({std::log(0.5f), std::log(0.3f), std::log(0.2f)});
    ++seen[t.sample(l)];
  }
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen.count(2), 0u);
  // Frequencies follow the renormalised probabilities 0.625 / 0.375 (loosely).
  EXPECT_NEAR(seen[0] / 500.0, 0.625, 0.08);
}

TEST(Sampler, SameSeedSameTokensOtherSeedDiffers) {
  auto run = [](uint64_t seed) {
    SamplingParams p;
    p.temperature = 1.f;
    p.seed = seed;
    Sampler s(p);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) {
      std::vector<float> l(50);
      for (size_t j = 0; j < l.size(); ++j) l[j] = float((j * 37) % 11) * 0.1f;
      out.push_back(s.sample(l));
    }
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

TEST(Sampler, InvalidParametersAreErrors) {
  SamplingParams p;
  p.temperature = -1.f;
  EXPECT_THROW(Sampler{p}, Error);
  p = {};
  p.top_p = 0.f;
  EXPECT_THROW(Sampler{p}, Error);
  p = {};
  p.repetition_penalty = 0.f;
  EXPECT_THROW(Sampler{p}, Error);
  p = {};
  p.top_k = -2;
  EXPECT_THROW(Sampler{p}, Error);
}

TEST(StopStrings, HoldsBackPrefixesAndCutsAtTheMatch) {
  StopStrings s({"<end>", "\n\n"});
  EXPECT_EQ(s.feed("Hello <e"), "Hello ");
  EXPECT_EQ(s.feed("n"), "");
  EXPECT_EQ(s.feed("x and"), "<enx and");
  EXPECT_EQ(s.feed(" more\n"), " more");
  EXPECT_EQ(s.feed("\nrest"), "");
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.flush(), "");
  StopStrings t({"abc"});
  EXPECT_EQ(t.feed("xxab"), "xx");
  EXPECT_FALSE(t.stopped());
  EXPECT_EQ(t.flush(), "ab");
}

}  // namespace
}  // namespace vlm
