// Sampler rules on hand-made logits, stop-string streaming, and seeds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
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

TEST(Sampler, LogitBiasIsAddedAfterThePenalties) {
  SamplingParams p;
  p.presence_penalty = 1.f;
  p.logit_bias = {{2, 100.f}, {0, -100.f}};
  Sampler s(p);
  std::vector<float> l = {5, 4, -60, 1};
  EXPECT_EQ(s.sample(l), 2);       // forced: -60 + 100
  EXPECT_FLOAT_EQ(l[0], -95.f);    // banned in effect
  l = {5, 4, -60.5f, 1};
  EXPECT_EQ(s.sample(l), 2);
  EXPECT_FLOAT_EQ(l[2], 38.5f);    // the presence penalty first: -60.5 - 1 + 100
  SamplingParams bad;
  bad.vocab_limit = 4;
  bad.logit_bias = {{4, 1.f}};
  EXPECT_THROW(validate(bad), Error);
  bad.logit_bias = {{3, 101.f}};
  EXPECT_THROW(validate(bad), Error);
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

// The draw as sampler.h states it, with every id sorted: probabilities exp(l/T - max/T) over the
// top-k (logit descending, ties by id), normalised; the shortest prefix reaching top_p; those of
// at least min_p times the first; then u·(their mass) walked in that order, u drawn as the
// Sampler draws it. The Sampler sorts only the prefix it reaches. With no rule to apply the order
// is the ids' own (the Sampler's weights are then f32 from the vector exp; on these rows its picks
// are still the reference's).
int32_t reference_draw(const std::vector<float>& l, const SamplingParams& p, std::mt19937_64& rng) {
  std::vector<int32_t> idx(l.size());
  std::iota(idx.begin(), idx.end(), 0);
  const bool rules = (p.top_k > 0 && size_t(p.top_k) < l.size()) || p.top_p < 1.f || p.min_p > 0.f;
  if (rules)
    std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
      const float x = l[size_t(a)], y = l[size_t(b)];
      return x > y || (x == y && a < b);
    });
  size_t n = p.top_k > 0 ? std::min(l.size(), size_t(p.top_k)) : l.size();
  const double mx = double(*std::max_element(l.begin(), l.end())) / p.temperature;
  std::vector<double> prob(n);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += prob[i] = std::exp(double(l[size_t(idx[i])]) / p.temperature - mx);
  for (double& x : prob) x /= sum;
  if (p.top_p < 1.f) {
    double acc = 0;
    size_t keep = 0;
    while (keep < n && acc < double(p.top_p)) acc += prob[keep++];
    n = keep;
  }
  if (p.min_p > 0.f) {
    size_t keep = 1;
    while (keep < n && prob[keep] >= double(p.min_p) * prob[0]) ++keep;
    n = keep;
  }
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += prob[i];
  double r = double(rng() >> 11) * 0x1.0p-53 * total;
  for (size_t i = 0; i + 1 < n; ++i) {
    if (r < prob[i]) return idx[i];
    r -= prob[i];
  }
  return idx[n - 1];
}

TEST(Sampler, DrawsAsTheFullySortedReferenceDoes) {
  // Flat (most of the mass far down the ranking), peaked, tied (logits in steps of 1/2) and
  // partly masked (-inf) rows of 20000 logits.
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<std::vector<float>> rows(4, std::vector<float>(20000));
  for (auto& r : rows)
    for (float& x : r) x = normal(gen);
  for (size_t i = 0; i < 20; ++i) rows[1][i * 997] = 25.f - float(i);
  for (float& x : rows[2]) x = std::round(2.f * x) / 2.f;
  for (size_t i = 0; i < rows[3].size(); i += 3) rows[3][i] = -std::numeric_limits<float>::infinity();
  int configs = 0;
  for (size_t r = 0; r < rows.size(); ++r)
    for (float t : {0.4f, 1.f, 1.8f})
      for (int k : {0, 1, 40, 3000})
        for (float top_p : {1.f, 0.9f, 0.3f})
          for (float min_p : {0.f, 0.02f}) {
            SamplingParams p;
            p.temperature = t, p.top_k = k, p.top_p = top_p, p.min_p = min_p;
            p.seed = uint64_t(1000 + configs++);
            Sampler s(p);
            std::mt19937_64 rng(p.seed);
            for (int draw = 0; draw < 3; ++draw) {
              std::vector<float> l = rows[r];
              const int32_t got = s.sample(l), want = reference_draw(rows[r], p, rng);
              EXPECT_EQ(got, want) << "row " << r << " T " << t << " top_k " << k << " top_p " << top_p
                                   << " min_p " << min_p << " draw " << draw;
              if (got != want) return;
            }
          }
  EXPECT_EQ(configs, 288);
}

TEST(Sampler, ArgmaxIsTheFirstMaximumPastNaN) {
  std::vector<float> x(37, 1.f);
  x[20] = x[33] = 2.f;
  x[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(argmax(x), 20);
  x[36] = 3.f;  // in the tail past the last whole group of 16
  EXPECT_EQ(argmax(x), 36);
  x[0] = std::numeric_limits<float>::quiet_NaN();  // as max_element: a NaN first stays first
  EXPECT_EQ(argmax(x), 0);
  EXPECT_THROW(argmax(std::span<const float>{}), Error);
}

TEST(Sampler, TinyTemperatureAndNonFiniteLogitsStillDraw) {
  SamplingParams p;
  p.temperature = 1e-30f;
  Sampler s(p);
  std::vector<float> l(5000, 0.f);
  l[1234] = 1e-3f;
  EXPECT_EQ(s.sample(l), 1234);
  p.temperature = 1.f;
  Sampler t(p);
  std::vector<float> m(5000, -std::numeric_limits<float>::infinity());
  m[7] = std::numeric_limits<float>::infinity();
  m[9] = std::numeric_limits<float>::quiet_NaN();
  const int32_t id = t.sample(m);  // meaningless weights, but an id and no hang
  EXPECT_GE(id, 0);
  EXPECT_LT(id, 5000);
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

TEST(StopStrings, KeepsTheMatchAndWaitsUntilArmed) {
  StopStrings k({"END"}, true);
  EXPECT_EQ(k.feed("one EN"), "one ");
  EXPECT_EQ(k.feed("D two"), "END");
  EXPECT_EQ(k.matched(), "END");
  // Unarmed text cannot complete a match; a match may begin in it and end in armed text.
  StopStrings u({"ab", "xyz"});
  EXPECT_EQ(u.feed("ab x", false), "ab ");
  EXPECT_FALSE(u.stopped());
  EXPECT_EQ(u.feed("yz!"), "");
  EXPECT_EQ(u.matched(), "xyz");
  StopStrings v({"ab"});
  EXPECT_EQ(v.feed("xa", false), "x");
  EXPECT_EQ(v.feed("b ab"), "");  // "ab" ends in armed text: a match from the held "a"
  EXPECT_EQ(v.matched(), "ab");
  StopStrings w({"ab"});
  EXPECT_EQ(w.feed("ab", false), "ab");
  EXPECT_EQ(w.feed(" and ab."), " and ");
  // Overlapping stops: "abcd" held back unarmed holds "ab", which must not match once armed.
  StopStrings o({"ab", "abcd"});
  EXPECT_EQ(o.feed("xabc", false), "x");
  EXPECT_EQ(o.feed("q"), "abcq");
  EXPECT_FALSE(o.stopped());
}

}  // namespace
}  // namespace vlm
