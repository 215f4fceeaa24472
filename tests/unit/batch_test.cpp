// The decoder's batch door (models/batch.h): several sequences' prompt chunks and decode
// rows in one forward give what each sequence gives alone; chunked prefill with image
// blocks equals the one-shot prefill; a warm decode step allocates nothing. Uses the
// tiny-text-f32 fixture. Image blocks are image-group ids on rows (what the decoder sees
// of an image: bidirectional attention inside the run), their rows any embedding rows.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <new>
#include <vector>

#include "core/error.h"
#include "io/checkpoint.h"
#include "models/batch.h"
#include "models/gemma3/decoder.h"
#include "models/gemma3/registry.h"

// Every heap allocation of this test binary is counted (all threads), so a test can show
// that a stretch of code allocates nothing.
namespace {
std::atomic<size_t> g_allocations{0};
}  // namespace

void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace vlm {
namespace {

namespace fs = std::filesystem;
using models::Batch;
using models::MaskSpec;
using models::SeqSlot;
using models::gemma3::Activations;
using models::gemma3::DecodeItem;
using models::gemma3::Decoder;

int32_t argmax(const float* x, size_t n) { return int32_t(std::max_element(x, x + n) - x); }

// One sequence of the test: prompt ids, image runs (first, end) and where its prompt is cut.
struct SeqCase {
  std::vector<int32_t> ids;
  std::vector<std::pair<int, int>> images;
  std::vector<int> cuts;  // chunk ends, the last = prompt length
  int admit = 0;          // the step it joins
  MaskMode mode() const { return images.empty() ? MaskMode::Causal : MaskMode::Hf; }
  std::vector<int32_t> groups() const {
    std::vector<int32_t> g(ids.size(), -1);
    for (size_t i = 0; i < images.size(); ++i)
      for (int j = images[i].first; j < images[i].second; ++j) g[size_t(j)] = int32_t(i);
    return g;
  }
};

std::vector<int32_t> ids_of(int n, int salt) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ids[size_t(i)] = 2 + (i * 7919 + salt * 104729) % 262000;
  return ids;
}

class BatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* root = std::getenv("VLM_FIXTURES");
    const fs::path dir = root ? fs::path(root) / "tiny-text-f32" : fs::path();
    if (dir.empty() || !fs::exists(dir / "config.json")) GTEST_SKIP() << "VLM_FIXTURES not built";
    ckpt_ = std::make_unique<Checkpoint>(models::gemma3::open_checkpoint(dir));
    pool_ = std::make_unique<ThreadPool>(2);
    model_ = std::make_unique<Decoder>(*ckpt_, *pool_);
    V_ = size_t(model_->vocab());
    H_ = size_t(model_->config().hidden_size);
  }

  // Prompt-row logits [len, V] and `steps` greedy decode logits of one sequence alone:
  // the whole prompt in one forward, then one-row forwards.
  void alone(const SeqCase& c, int steps, std::vector<float>* prompt_logits, std::vector<float>* decode_logits,
             std::vector<int32_t>* tokens) {
    const size_t n = c.ids.size();
    KvCache cache = model_->new_cache(256);
    MaskSpec spec{.mode = c.mode(), .group = c.groups(), .window = model_->config().sliding_window};
    Activations act(model_->config(), n);
    std::vector<float> rows = model_->embedder().embed(c.ids);
    std::vector<int64_t> pos(n);
    std::vector<int32_t> seq(n, 0);
    std::vector<uint8_t> want(n, 1);
    for (size_t i = 0; i < n; ++i) pos[i] = int64_t(i);
    prompt_logits->assign(n * V_, 0.f);
    const SeqSlot slot{&cache, &spec};
    model_->forward(Batch{rows.data(), n, pos.data(), seq.data(), want.data()}, {&slot, 1}, act,
                    prompt_logits->data());
    int32_t next = argmax(prompt_logits->data() + (n - 1) * V_, V_);
    decode_logits->clear();
    tokens->clear();
    std::vector<float> l(V_);
    for (int s = 0; s < steps; ++s) {
      tokens->push_back(next);
      const DecodeItem item{&cache, next};
      model_->decode_step({&item, 1}, act, l.data());
      decode_logits->insert(decode_logits->end(), l.begin(), l.end());
      next = argmax(l.data(), V_);
    }
  }

  static float worst_rel(const float* a, const float* b, size_t n) {
    float worst = 0, scale = 0;
    for (size_t i = 0; i < n; ++i) {
      worst = std::max(worst, std::fabs(a[i] - b[i]));
      scale = std::max(scale, std::fabs(b[i]));
    }
    return worst / std::max(scale, 1e-30f);
  }

  std::unique_ptr<Checkpoint> ckpt_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<Decoder> model_;
  size_t V_ = 0, H_ = 0;
};

// Six sequences of different lengths, three with one or two image runs, admitted at
// different steps: prompt chunks of new ones ride in the same forward as decode rows of
// running ones. Every prompt row's logits and every greedy step match the sequence alone
// (within 1e-5 of the largest logit; the matmul may sum in another order for another row
// count) and the greedy tokens are identical.
TEST_F(BatchTest, PackedStepsEqualEachSequenceAlone) {
  const int W = model_->config().sliding_window;  // 8: chunks start before, at and past it
  ASSERT_EQ(W, 8);
  std::vector<SeqCase> cases = {
      {ids_of(5, 1), {}, {5}, 0},
      {ids_of(12, 2), {{3, 7}}, {7, 12}, 0},
      {ids_of(20, 3), {}, {8, 9, 20}, 0},
      {ids_of(9, 4), {{1, 5}, {5, 9}}, {9}, 1},
      {ids_of(30, 5), {{4, 10}, {14, 20}}, {14, 22, 30}, 2},
      {ids_of(16, 6), {{2, 6}}, {2, 16}, 3},
  };
  const int steps = 8;
  const size_t S = cases.size();
  std::vector<std::vector<float>> ref_prompt(S), ref_decode(S);
  std::vector<std::vector<int32_t>> ref_tokens(S);
  for (size_t s = 0; s < S; ++s) alone(cases[s], steps, &ref_prompt[s], &ref_decode[s], &ref_tokens[s]);

  std::vector<KvCache> caches;
  for (size_t s = 0; s < S; ++s) caches.push_back(model_->new_cache(256));
  std::vector<size_t> chunk(S, 0);            // next chunk index
  std::vector<std::vector<float>> got_prompt(S), got_decode(S);
  std::vector<std::vector<int32_t>> got_tokens(S);
  std::vector<int32_t> next(S, -1);
  std::vector<MaskSpec> specs(S);
  Activations act(model_->config(), 64);
  size_t mixed_steps = 0;
  for (int step = 0; step < 40; ++step) {
    std::vector<float> rows;
    std::vector<int64_t> pos;
    std::vector<int32_t> seq;
    std::vector<uint8_t> want;
    std::vector<SeqSlot> slots;
    std::vector<std::pair<size_t, int>> owner;  // per logits row: sequence, prompt row (-1 = decode)
    bool has_chunk = false, has_decode = false;
    for (size_t s = 0; s < S; ++s) {
      const SeqCase& c = cases[s];
      if (step < c.admit) continue;
      const int32_t slot = int32_t(slots.size());
      const int64_t P = caches[s].length();
      if (chunk[s] < c.cuts.size()) {
        const int begin = int(P), end = c.cuts[chunk[s]++];
        const std::vector<int32_t> g = c.groups();
        specs[s] = MaskSpec{.mode = c.mode(), .group = std::vector<int32_t>(g.begin() + begin, g.begin() + end),
                            .window = W};
        const std::vector<float> e = model_->embedder().embed({c.ids.data() + begin, size_t(end - begin)});
        rows.insert(rows.end(), e.begin(), e.end());
        for (int i = begin; i < end; ++i) {
          pos.push_back(i);
          seq.push_back(slot);
          want.push_back(1);
          owner.push_back({s, i});
        }
        slots.push_back({&caches[s], &specs[s]});
        has_chunk = true;
      } else if (got_tokens[s].size() < size_t(steps)) {
        got_tokens[s].push_back(next[s]);
        const std::vector<float> e = model_->embedder().embed({&next[s], 1});
        rows.insert(rows.end(), e.begin(), e.end());
        pos.push_back(P);
        seq.push_back(slot);
        want.push_back(1);
        owner.push_back({s, -1});
        slots.push_back({&caches[s], nullptr});
        has_decode = true;
      }
    }
    if (slots.empty()) break;
    mixed_steps += has_chunk && has_decode;
    std::vector<float> logits(owner.size() * V_);
    model_->forward(Batch{rows.data(), pos.size(), pos.data(), seq.data(), want.data()}, slots, act, logits.data());
    for (size_t r = 0; r < owner.size(); ++r) {
      const auto [s, i] = owner[r];
      const float* l = logits.data() + r * V_;
      if (i >= 0) {
        got_prompt[s].insert(got_prompt[s].end(), l, l + V_);
        if (size_t(i) + 1 == cases[s].ids.size()) next[s] = argmax(l, V_);
      } else {
        got_decode[s].insert(got_decode[s].end(), l, l + V_);
        next[s] = argmax(l, V_);
      }
    }
  }
  EXPECT_GE(mixed_steps, 3u);
  for (size_t s = 0; s < S; ++s) {
    ASSERT_EQ(got_prompt[s].size(), ref_prompt[s].size()) << s;
    ASSERT_EQ(got_decode[s].size(), ref_decode[s].size()) << s;
    EXPECT_LE(worst_rel(got_prompt[s].data(), ref_prompt[s].data(), ref_prompt[s].size()), 1e-5f) << "seq " << s;
    EXPECT_LE(worst_rel(got_decode[s].data(), ref_decode[s].data(), ref_decode[s].size()), 1e-5f) << "seq " << s;
    EXPECT_EQ(got_tokens[s], ref_tokens[s]) << "seq " << s;
    EXPECT_EQ(caches[s].length(), int64_t(cases[s].ids.size()) + steps) << s;
  }
}

// A prompt with two image runs prefilled in chunks (boundaries before, between and after
// the runs, never inside one, around the sliding window) gives every row's logits of the
// one-shot prefill, and the same decode after it.
TEST_F(BatchTest, ChunkedPrefillWithImagesEqualsOneShot) {
  SeqCase c{ids_of(40, 9), {{3, 11}, {13, 29}}, {40}, 0};
  std::vector<float> ref, ref_decode, got, got_decode;
  std::vector<int32_t> ref_tokens, got_tokens;
  alone(c, 6, &ref, &ref_decode, &ref_tokens);
  for (const std::vector<int>& cuts : {std::vector<int>{3, 40}, std::vector<int>{11, 13, 29, 40},
                                       std::vector<int>{2, 3, 12, 13, 30, 31, 40}, std::vector<int>{29, 40}}) {
    KvCache cache = model_->new_cache(256);
    Activations act(model_->config(), 40);
    got.clear();
    int begin = 0;
    for (int end : cuts) {
      const size_t n = size_t(end - begin);
      const std::vector<int32_t> g = c.groups();
      const MaskSpec spec{.mode = MaskMode::Hf, .group = std::vector<int32_t>(g.begin() + begin, g.begin() + end),
                          .window = model_->config().sliding_window};
      const std::vector<float> rows = model_->embedder().embed({c.ids.data() + begin, n});
      std::vector<int64_t> pos(n);
      for (size_t i = 0; i < n; ++i) pos[i] = begin + int64_t(i);
      const std::vector<int32_t> seq(n, 0);
      const std::vector<uint8_t> want(n, 1);
      std::vector<float> l(n * V_);
      const SeqSlot slot{&cache, &spec};
      model_->forward(Batch{rows.data(), n, pos.data(), seq.data(), want.data()}, {&slot, 1}, act, l.data());
      got.insert(got.end(), l.begin(), l.end());
      begin = end;
    }
    ASSERT_EQ(got.size(), ref.size());
    EXPECT_LE(worst_rel(got.data(), ref.data(), ref.size()), 1e-5f) << "first cut " << cuts[0];
    int32_t next = argmax(got.data() + (c.ids.size() - 1) * V_, V_);
    std::vector<float> l(V_);
    for (int s = 0; s < 6; ++s) {
      EXPECT_EQ(next, ref_tokens[size_t(s)]);
      const DecodeItem item{&cache, next};
      model_->decode_step({&item, 1}, act, l.data());
      EXPECT_LE(worst_rel(l.data(), ref_decode.data() + size_t(s) * V_, V_), 1e-5f) << "step " << s;
      next = argmax(l.data(), V_);
    }
  }
}

// Mlx mode lets every prompt position see every other: only a one-shot prefill is exact,
// so a continuation is refused (before any cache changes).
TEST_F(BatchTest, MlxContinuationRefused) {
  KvCache cache = model_->new_cache(64);
  Activations act(model_->config(), 8);
  const std::vector<int32_t> ids = ids_of(8, 3);
  const std::vector<float> rows = model_->embedder().embed(ids);
  const MaskSpec spec{.mode = MaskMode::Mlx, .window = model_->config().sliding_window};
  std::vector<int64_t> pos = {0, 1, 2, 3};
  const std::vector<int32_t> seq(4, 0);
  const std::vector<uint8_t> want(4, 0);
  const SeqSlot slot{&cache, &spec};
  model_->forward(Batch{rows.data(), 4, pos.data(), seq.data(), want.data()}, {&slot, 1}, act, nullptr);
  ASSERT_EQ(cache.length(), 4);
  pos = {4, 5, 6, 7};
  try {
    model_->forward(Batch{rows.data() + 4 * H_, 4, pos.data(), seq.data(), want.data()}, {&slot, 1}, act, nullptr);
    FAIL() << "mlx continuation accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mlx"), std::string::npos) << e.what();
  }
  EXPECT_EQ(cache.length(), 4);
}

// Batch shapes the door refuses, each before any cache changes.
TEST_F(BatchTest, BadBatchesRefused) {
  KvCache a = model_->new_cache(64), b = model_->new_cache(64);
  Activations act(model_->config(), 8);
  const std::vector<float> rows = model_->embedder().embed(ids_of(4, 1));
  const MaskSpec spec{.window = model_->config().sliding_window};
  const std::vector<uint8_t> want(4, 0);
  auto run = [&](std::vector<int64_t> pos, std::vector<int32_t> seq, std::vector<SeqSlot> slots) {
    model_->forward(Batch{rows.data(), pos.size(), pos.data(), seq.data(), want.data()}, slots, act, nullptr);
  };
  EXPECT_THROW(run({0, 1, 0, 2}, {0, 0, 1, 0}, {{&a, &spec}, {&b, &spec}}), Error);  // not contiguous
  EXPECT_THROW(run({0, 2, 3, 4}, {0, 0, 0, 0}, {{&a, &spec}}), Error);                // wrong positions
  EXPECT_THROW(run({0, 1, 0, 1}, {0, 0, 1, 1}, {{&a, &spec}, {&a, &spec}}), Error);   // one cache twice
  EXPECT_THROW(run({0, 1, 2, 3}, {0, 0, 0, 5}, {{&a, &spec}}), Error);                // no such slot
  EXPECT_THROW(run({0, 1, 2, 3}, {0, 0, 0, 0}, {{&a, nullptr}}), Error);              // decode of 4 rows
  EXPECT_EQ(a.length(), 0);
  EXPECT_EQ(b.length(), 0);
  Activations small(model_->config(), 2);
  EXPECT_THROW(model_->forward(Batch{rows.data(), 4, nullptr, nullptr, want.data()}, {}, small, nullptr), Error);
}

// Once warm, decode steps over caches with room reserved allocate nothing: the work rows
// live in the caller's Activations, RoPE angles are computed into them, and attention's
// work rows were sized for the context.
TEST_F(BatchTest, WarmDecodeStepsAllocateNothing) {
  const int64_t context = 128;
  Activations act(model_->config(), 3, size_t(context));
  std::vector<KvCache> caches;
  std::vector<DecodeItem> items;
  for (int n : {3, 9, 17}) {
    caches.push_back(model_->new_cache(context));
    PrefillMasks m = build_masks(MaskMode::Causal, std::span<const uint8_t>{}, n, n, 8);
    model_->prefill_from_embeddings(
        PrefillInput{model_->embedder().embed(ids_of(n, n)), std::move(m.global), std::move(m.sliding), n, n},
        caches.back());
  }
  for (KvCache& c : caches) {
    c.reserve(40);
    items.push_back({&c, 7});
  }
  std::vector<float> logits(items.size() * V_);
  for (int s = 0; s < 2; ++s) model_->decode_step(items, act, logits.data());
  const size_t before = g_allocations.load();
  for (int s = 0; s < 20; ++s) {
    model_->decode_step(items, act, logits.data());
    for (size_t b = 0; b < items.size(); ++b) items[b].token = argmax(logits.data() + b * V_, V_);
  }
  const size_t during = g_allocations.load() - before;
  EXPECT_EQ(during, 0u) << "heap allocations in 20 warm decode steps";
  EXPECT_EQ(caches[0].length(), 3 + 22);
}

}  // namespace
}  // namespace vlm
