// The engine (issue 9): sequences of different lengths, some with images, admitted at different
// steps so prompt chunks of new ones run in the same steps as decode rows of running ones, give
// exactly the greedy tokens and (within 1e-5 of the largest logit) the logits each gives alone;
// cancellation in every phase frees the sequence; on_finish comes exactly once; requests that
// cannot run fail on admission, before any compute. Uses the tiny-f32 fixture (vision included).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/draft.h"
#include "engine/engine.h"
#include "model_folder.h"

namespace vlm::engine {
namespace {

namespace fs = std::filesystem;

fs::path fixture(const char* name) {
  const char* root = std::getenv("VLM_FIXTURES");
  return root ? fs::path(root) / name : fs::path();
}

vision::RgbImage noise_image(int w, int h, uint32_t seed) {
  vision::RgbImage im{w, h, std::vector<uint8_t>(size_t(w) * size_t(h) * 3)};
  std::mt19937 rng(seed);
  // Smooth gradients plus noise, so the tower sees structure, not only noise.
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        im.rgb[(size_t(y) * size_t(w) + size_t(x)) * 3 + size_t(c)] =
            uint8_t((x * (c + 1) * 7 + y * (3 - c) * 5 + int(rng() % 40)) & 0xff);
  return im;
}

// What one sequence produced, recorded through its callbacks.
struct Record {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
  std::string text;
  int finishes = 0;
  FinishReason reason = FinishReason::Length;
  StopReason stop;
  Usage usage;
};

Callbacks record_into(Record& r) {
  Callbacks cb;
  cb.on_token = [&r](const TokenEvent& e) { r.tokens.push_back(e.id); };
  cb.on_text = [&r](std::string_view t) { r.text += t; };
  cb.on_logits = [&r](std::span<const float> row) { r.logits.emplace_back(row.begin(), row.end()); };
  cb.on_finish = [&r](FinishReason f, const Usage& u) {
    ++r.finishes;
    r.reason = f;
    r.usage = u;
  };
  return cb;
}

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const fs::path dir = fixture("tiny-f32");
    if (dir.empty() || !fs::exists(dir / "config.json")) return;
    ModelOptions o;
    o.threads = 2;
    model_ = Model::load(dir, o);
    // The same model with a sliding window of 64 instead of 8: its rings then hold a whole short
    // conversation, so a prefix shorter than a finished sequence can be taken (PrefixCache). And
    // with one of 256 and Pan & Scan on, for prompts of an image and its crops.
    wide_dir_ = with_window(dir, 64);
    wide_ = Model::load(wide_dir_->path, o);
    pans_dir_ = with_window(dir, 256);
    o.pan_and_scan = true;
    pans_ = Model::load(pans_dir_->path, o);
  }
  // A folder of `dir`'s files (linked) whose config.json has another sliding window.
  static std::unique_ptr<test::TempDir> with_window(const fs::path& dir, int window) {
    auto out = std::make_unique<test::TempDir>();
    for (const auto& f : fs::directory_iterator(dir))
      if (f.path().filename() != "config.json") fs::create_symlink(fs::absolute(f.path()), out->path / f.path().filename());
    nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir / "config.json"));
    cfg["text_config"]["sliding_window"] = window;
    std::ofstream(out->path / "config.json") << cfg.dump(2);
    return out;
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << "VLM_FIXTURES not built";
  }
  static void TearDownTestSuite() {
    model_.reset();
    wide_.reset();
    wide_dir_.reset();
    pans_.reset();
    pans_dir_.reset();
  }

  // A greedy request: a chat turn with `n_images` images (in the prompt: images first).
  Request request(const std::string& text, int n_images, uint32_t seed, int max_tokens = 8) const {
    return request_with(std::vector<vision::RgbImage>(), text, n_images, seed, max_tokens);
  }
  // The same with `images` first, then n_images made ones.
  Request request_with(std::vector<vision::RgbImage> images, const std::string& text, int n_images, uint32_t seed,
                       int max_tokens = 8) const {
    Request r;
    r.images = std::move(images);
    for (int i = 0; i < n_images; ++i) r.images.push_back(noise_image(40 + 13 * i, 32 + 9 * int(seed % 5), seed + i));
    const std::vector<text::ChatMessage> msgs{user_turn(text, r.images.size())};
    r.prompt = model_->chat_prompt(msgs, r.images);
    r.max_tokens = max_tokens;
    r.ignore_eos = true;  // run to max_tokens: the same number of steps alone and together
    return r;
  }
  Record alone(const Request& req, const Model* m = nullptr) const {
    m = m ? m : model_.get();
    Record r;
    Engine eng(*m, StepBudget{.prefill_rows = 4096, .images = 8, .vision_layers = 0});  // whole images
    const auto seq = std::make_shared<Sequence>(*m, req, record_into(r));
    eng.add(seq);
    eng.run_until_idle();
    r.stop = seq->stop_reason();
    return r;
  }

  static inline std::shared_ptr<const Model> model_, wide_, pans_;
  static inline std::unique_ptr<test::TempDir> wide_dir_, pans_dir_;
};

float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

// The largest |difference| between two logits rows.
float row_apart(const std::vector<float>& a, const std::vector<float>& b) {
  float worst = 0;
  for (size_t k = 0; k < std::min(a.size(), b.size()); ++k) worst = std::max(worst, std::fabs(a[k] - b[k]));
  return worst;
}

// Every logits row of `got` within 1e-5 of the largest |logit| of `solo`'s row (a batched pass
// sums in another order than a solo one); returns the largest difference.
float expect_logits_near(const Record& got, const Record& solo) {
  EXPECT_EQ(got.logits.size(), solo.logits.size());
  float worst_all = 0;
  for (size_t t = 0; t < std::min(got.logits.size(), solo.logits.size()); ++t) {
    const std::vector<float>& a = got.logits[t];
    const std::vector<float>& b = solo.logits[t];
    EXPECT_EQ(a.size(), b.size());
    const float worst = row_apart(a, b);
    EXPECT_LE(worst, 1e-5f * std::max(1.0f, max_abs(b))) << "logits row " << t;
    worst_all = std::max(worst_all, worst);
  }
  return worst_all;
}

TEST_F(EngineTest, MixedStepsGiveEachSequenceItsSoloTokensAndLogits) {
  // Six prompts of different lengths, three with images (one with two).
  const std::vector<Request> reqs = {
      request("Hi", 0, 1, 10),
      request("What is in this picture? Describe it in detail, please.", 1, 2, 8),
      request("A longer question about nothing in particular, written to take several chunks of the "
              "prompt budget before the first token comes out of the model at all.",
              0, 3, 6),
      request("Compare these two images.", 2, 4, 7),
      request("Short", 0, 5, 12),
      request("And this one?", 1, 6, 5),
  };
  std::vector<Record> solo;
  for (const Request& r : reqs) solo.push_back(alone(r));

  // Together: a small row budget, so prompts take several steps, and arrivals spread over time.
  std::vector<Record> got(reqs.size());
  Engine eng(*model_, StepBudget{.prefill_rows = 24, .images = 1});
  const std::map<int, std::vector<size_t>> arrivals = {{0, {0, 1}}, {2, {2}}, {3, {3}}, {5, {4}}, {9, {5}}};
  int mixed_steps = 0, steps = 0;
  for (int step = 0; step < 200 && (step <= arrivals.rbegin()->first || !eng.idle()); ++step) {
    if (auto it = arrivals.find(step); it != arrivals.end())
      for (size_t i : it->second) eng.add(std::make_shared<Sequence>(*model_, reqs[i], record_into(got[i])));
    const StepStats st = eng.step();
    mixed_steps += st.decode_rows > 0 && st.prefill_rows > 0;
    ++steps;
  }
  EXPECT_TRUE(eng.idle());
  EXPECT_GE(mixed_steps, 3) << "prompt chunks never shared a step with decode rows";
  EXPECT_EQ(eng.kv_bytes(), 0u);

  float worst_all = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE("sequence " + std::to_string(i));
    EXPECT_EQ(got[i].finishes, 1);
    EXPECT_EQ(got[i].reason, FinishReason::Length);
    ASSERT_EQ(got[i].tokens, solo[i].tokens);
    EXPECT_EQ(int(got[i].tokens.size()), reqs[i].max_tokens);
    EXPECT_EQ(got[i].text, solo[i].text);
    EXPECT_EQ(got[i].usage.prompt_tokens, int(reqs[i].prompt.size()));
    EXPECT_EQ(got[i].usage.completion_tokens, reqs[i].max_tokens);
    worst_all = std::max(worst_all, expect_logits_near(got[i], solo[i]));
  }
  RecordProperty("max_logit_diff", std::to_string(worst_all));
  std::printf("mixed vs alone: %d steps, %d with decode rows and prompt chunks together, max |logit diff| %g\n",
              steps, mixed_steps, double(worst_all));
  // The image requests really went through the tower: their tokens differ from a text-only run.
  Request text_only = reqs[1];
  text_only.images.clear();
  text_only.prompt = model_->chat_prompt(std::vector<text::ChatMessage>{user_turn("What is in this picture? Describe it in detail, please.", 0)}, {});
  EXPECT_NE(alone(text_only).logits[0], solo[1].logits[0]);
}

TEST_F(EngineTest, AnImageBlockLargerThanTheBudgetGoesWhole) {
  const Request req = request("Look", 1, 9, 4);
  const Record solo = alone(req);
  Record r;
  Engine eng(*model_, StepBudget{.prefill_rows = 3, .images = 1});
  eng.add(std::make_shared<Sequence>(*model_, req, record_into(r)));
  int biggest = 0;
  while (!eng.idle()) biggest = std::max(biggest, eng.step().prefill_rows);
  EXPECT_EQ(biggest, model_->config().mm_tokens_per_image);  // the soft tokens, never cut
  EXPECT_EQ(r.tokens, solo.tokens);
  ASSERT_EQ(r.logits.size(), solo.logits.size());
  for (size_t t = 0; t < r.logits.size(); ++t) {
    const float tol = 1e-5f * std::max(1.0f, max_abs(solo.logits[t]));
    for (size_t k = 0; k < r.logits[t].size(); ++k) ASSERT_NEAR(r.logits[t][k], solo.logits[t][k], tol);
  }
}

TEST_F(EngineTest, CancelInEveryPhaseFreesTheSequenceAndFinishesOnce) {
  for (Phase when : {Phase::Queued, Phase::Encoding, Phase::Prefill, Phase::Decode}) {
    SCOPED_TRACE(std::string(phase_name(when)));
    // A running sequence keeps the engine busy; max_seqs 1 keeps the second one queued.
    Record other, r;
    Engine eng(*model_, StepBudget{.prefill_rows = 8, .images = 1, .max_seqs = when == Phase::Queued ? 1 : 0});
    auto keep = std::make_shared<Sequence>(*model_, request("Hi", 0, 1, 40), record_into(other));
    auto seq = std::make_shared<Sequence>(*model_, request("Compare these two images please", 2, 7, 40),
                                          record_into(r));
    eng.add(keep);
    eng.step();
    eng.add(seq);
    // Prefill: once a first chunk is in the cache (the encode ends a step before any chunk runs).
    auto reached = [&] { return seq->phase() == when && (when != Phase::Prefill || seq->kv_bytes() > 0); };
    for (int i = 0; i < 100 && !reached(); ++i) eng.step();
    ASSERT_EQ(seq->phase(), when);
    const size_t tokens_before = r.tokens.size();
    if (when == Phase::Prefill || when == Phase::Decode) EXPECT_GT(seq->kv_bytes(), 0u);
    seq->cancel();
    EXPECT_EQ(r.finishes, 0);  // dropped at the next step, not in cancel()
    eng.step();
    EXPECT_EQ(r.finishes, 1);
    EXPECT_EQ(r.reason, FinishReason::Cancelled);
    EXPECT_EQ(seq->phase(), Phase::Finished);
    EXPECT_EQ(seq->kv_bytes(), 0u);
    EXPECT_EQ(r.tokens.size(), tokens_before);  // no compute spent on it afterwards
    EXPECT_EQ(eng.running(), 1u);
    EXPECT_EQ(eng.waiting(), 0u);
    EXPECT_EQ(eng.kv_bytes(), keep->kv_bytes());  // only the other sequence's cache is left
    seq->cancel();  // again: nothing more happens
    eng.run_until_idle();
    EXPECT_EQ(r.finishes, 1);
    EXPECT_EQ(other.finishes, 1);
    EXPECT_EQ(other.reason, FinishReason::Length);
    EXPECT_EQ(other.tokens, alone(request("Hi", 0, 1, 40)).tokens);  // the other one is unaffected
  }
}

TEST_F(EngineTest, AdmissionErrorsFinishOnceBeforeCompute) {
  struct Case {
    std::string name;
    Request req;
    std::string want;
  };
  std::vector<Case> cases;
  {
    Request r = request("Hi", 1, 3);
    r.images.clear();  // soft tokens without their image
    cases.push_back({"soft tokens without images", r, "image soft tokens"});
  }
  {
    Request r = request("Hi", 0, 3);
    r.prompt.push_back(model_->vocab() + 5);
    cases.push_back({"id out of range", r, "outside the vocabulary"});
  }
  {
    Request r = request("Hi", 0, 3);
    r.prompt.clear();
    cases.push_back({"empty prompt", r, "no tokens"});
  }
  {
    Request r = request("Hi", 0, 3);
    r.sampling.temperature = -1;
    cases.push_back({"bad temperature", r, "temperature"});
  }
  {
    Request r = request("Hi", 0, 3);
    r.prompt.assign(size_t(model_->context()) + 1, 2);
    cases.push_back({"over the context", r, "exceeds the context limit of " + std::to_string(model_->context())});
  }
  for (Case& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_THROW(validate_request(*model_, c.req), Error);
    Record r;
    Engine eng(*model_);
    auto seq = std::make_shared<Sequence>(*model_, c.req, record_into(r));
    eng.add(seq);
    const StepStats st = eng.step();
    EXPECT_EQ(st.decode_rows + st.prefill_rows + st.images, 0);
    EXPECT_EQ(r.finishes, 1);
    EXPECT_EQ(r.reason, FinishReason::Error);
    EXPECT_NE(seq->error().find(c.want), std::string::npos) << seq->error();
    EXPECT_TRUE(eng.idle());
    eng.step();
    EXPECT_EQ(r.finishes, 1);
  }
}

TEST_F(EngineTest, StopIdsStopStringsAndMaxTokens) {
  Request base = request("Tell me something", 0, 2, 12);
  const Record full = alone(base);
  ASSERT_EQ(full.tokens.size(), 12u);
  Request stop_id = base;
  stop_id.stop_ids = std::vector<int32_t>{full.tokens[4]};
  const Record a = alone(stop_id);
  EXPECT_EQ(a.reason, FinishReason::Stop);
  EXPECT_EQ(a.finishes, 1);
  const auto first = std::find(full.tokens.begin(), full.tokens.end(), full.tokens[4]);
  EXPECT_EQ(a.tokens, std::vector<int32_t>(full.tokens.begin(), first));  // the stop id is not reported
  EXPECT_EQ(a.stop, StopReason(full.tokens[4]));
  EXPECT_EQ(full.stop, StopReason());
  Request zero = base;
  zero.max_tokens = 0;
  const Record z = alone(zero);
  EXPECT_EQ(z.reason, FinishReason::Length);
  EXPECT_TRUE(z.tokens.empty());
  if (full.text.size() > 4) {
    Request ss = base;
    ss.stop_strings = {full.text.substr(2, 2)};
    const Record s = alone(ss);
    EXPECT_EQ(s.reason, FinishReason::Stop);
    EXPECT_EQ(s.text, full.text.substr(0, full.text.find(ss.stop_strings[0])));
    EXPECT_EQ(s.stop, StopReason(ss.stop_strings[0]));
    ss.include_stop_string = true;
    const Record kept = alone(ss);
    EXPECT_EQ(kept.text, full.text.substr(0, full.text.find(ss.stop_strings[0]) + 2));
    EXPECT_EQ(kept.tokens, s.tokens);
  }
}

// vLLM's min_tokens: the stop ids are out of the draw for the first min_tokens tokens (the logits
// row reported stays raw), and a stop string must end in a later token's text.
TEST_F(EngineTest, MinTokensHoldsOffStopIdsAndStopStrings) {
  Request base = request("Tell me something", 0, 2, 12);
  const Record full = alone(base);
  ASSERT_EQ(full.tokens.size(), 12u);
  // The stop id: the answer's first token, so each of the first min_tokens draws is another.
  const int32_t stop = full.tokens[0];
  Request r = base;
  r.stop_ids = {stop};
  r.min_tokens = 3;
  const Record held = alone(r);
  ASSERT_GE(held.tokens.size(), 3u);
  for (size_t t = 0; t < held.tokens.size(); ++t) {
    EXPECT_NE(held.tokens[t], stop) << t;
    if (t >= 3) continue;
    // The draw at token t + 1 is the best of the row without the stop id.
    std::vector<float> row = held.logits[t];
    row.resize(size_t(model_->vocab_limit()));
    row[size_t(stop)] = -INFINITY;
    EXPECT_EQ(held.tokens[t], int32_t(std::max_element(row.begin(), row.end()) - row.begin())) << t;
  }
  EXPECT_EQ(held.logits[0], full.logits[0]);  // reported before the mask
  EXPECT_EQ(held.reason == FinishReason::Stop, held.stop == StopReason(stop));
  r.max_tokens = r.min_tokens - 1;
  EXPECT_THROW(validate_request(*model_, r), Error);  // min_tokens past max_tokens
  EXPECT_EQ(alone(r).reason, FinishReason::Error);
  Request neg = base;
  neg.min_tokens = -1;
  EXPECT_THROW(validate_request(*model_, neg), Error);
  neg.min_tokens = 0;
  neg.stop_ids = {model_->vocab()};
  EXPECT_THROW(validate_request(*model_, neg), Error);

  // A stop string in the first token's text: with min_tokens 1 it is passed over.
  Record first;
  {
    Request one = base;
    one.max_tokens = 1;
    first = alone(one);
  }
  if (!first.text.empty()) {
    Request ss = base;
    ss.stop_strings = {first.text.substr(0, 1)};
    const Record at_once = alone(ss);
    EXPECT_TRUE(at_once.text.empty());
    EXPECT_EQ(at_once.tokens.size(), 1u);
    ss.min_tokens = 1;
    const Record later = alone(ss);
    const size_t again = full.text.find(ss.stop_strings[0], first.text.size());
    // The next occurrence that ends in a later token's text ends it.
    EXPECT_EQ(later.text, again == std::string::npos ? full.text : full.text.substr(0, again));
  }
}

TEST_F(EngineTest, LogprobsAreLogSoftmaxOfTheRawRow) {
  Request r = request("Hi", 0, 1, 3);
  r.top_logprobs = 3;
  std::vector<TokenEvent> events;
  std::vector<std::vector<float>> rows;
  Callbacks cb;
  cb.on_token = [&](const TokenEvent& e) { events.push_back(e); };
  cb.on_logits = [&](std::span<const float> row) { rows.emplace_back(row.begin(), row.end()); };
  Engine eng(*model_);
  eng.add(std::make_shared<Sequence>(*model_, r, cb));
  eng.run_until_idle();
  ASSERT_EQ(events.size(), 3u);
  for (size_t t = 0; t < events.size(); ++t) {
    const std::vector<float>& row = rows[t];
    const size_t V = size_t(model_->vocab_limit());
    double mx = *std::max_element(row.begin(), row.begin() + std::ptrdiff_t(V)), sum = 0;
    for (size_t k = 0; k < V; ++k) sum += std::exp(double(row[k]) - mx);
    const double lse = mx + std::log(sum);
    EXPECT_NEAR(events[t].logprob, row[size_t(events[t].id)] - lse, 1e-5);
    ASSERT_EQ(events[t].top.size(), 3u);
    EXPECT_EQ(events[t].top[0].first, events[t].id);  // greedy picks the most likely
    EXPECT_GE(events[t].top[0].second, events[t].top[1].second);
    EXPECT_GE(events[t].top[1].second, events[t].top[2].second);
    EXPECT_EQ(events[t].rank, 1);
  }
  // A rank is one more than the ids with a larger logit (ties share it).
  const std::vector<float> row = {1.f, 3.f, 3.f, 0.f, 2.f};
  const int want[] = {4, 1, 1, 5, 3};
  for (int32_t id = 0; id < 5; ++id) {
    TokenEvent e;
    logprobs_of(row, id, 2, e);
    EXPECT_EQ(e.rank, want[id]) << "id " << id;
  }
}

// The KV memory budget: each sequence is admitted with the most its cache can hold (prompt plus
// max_tokens), never past the budget; the queue's head waits until finished sequences free
// theirs; a request larger than the whole budget fails on admission naming both sizes; every
// admitted sequence gives its solo tokens.
TEST_F(EngineTest, KvBudgetBoundsWhatIsAdmitted) {
  const std::vector<Request> reqs = {request("one", 0, 11, 6), request("two two", 1, 12, 9),
                                     request("three three three", 0, 13, 4), request("four", 0, 14, 7)};
  size_t biggest = 0, sum = 0;
  for (const Request& r : reqs) {
    const size_t need = kv_reservation(*model_, r, {});
    const TextConfig& t = model_->config().text;
    // By hand: every layer holds min(window, P + max_tokens) (sliding) or P + max_tokens positions.
    size_t slots = 0, sliding = 0;
    const int64_t n = int64_t(r.prompt.size()) + r.max_tokens;
    for (int l = 0; l < t.num_layers; ++l) {
      const bool s = t.layer_kinds[size_t(l)] == LayerKind::Sliding;
      slots += size_t(s ? std::min<int64_t>(n, t.sliding_window) : n);
      sliding += s;
    }
    const size_t row = size_t(t.num_kv_heads * t.head_dim) * 8;  // keys and values, f32
    ASSERT_EQ(need, slots * row) << r.prompt.size();
    // With a prefix cache each sliding layer also keeps 64 overwritten rows once its ring wraps.
    EXPECT_EQ(kv_reservation(*model_, r, {.overwritten = 64}), need + (n > t.sliding_window ? sliding * 64 * row : 0));
    // With drafts of 6 ids, the 6 rows a draft's check may give back.
    EXPECT_EQ(kv_reservation(*model_, r, {.draft = 6}), need + (n > t.sliding_window ? sliding * 6 * row : 0));
    biggest = std::max(biggest, need);
    sum += need;
  }
  const size_t budget = biggest * 2;  // room for two at most, never for all four
  ASSERT_LT(budget, sum);
  std::vector<Record> solo;
  for (const Request& r : reqs) solo.push_back(alone(r));

  std::vector<Record> got(reqs.size() + 1);
  Engine eng(*model_, StepBudget{.prefill_rows = 4096, .images = 8, .kv_bytes = budget});
  std::vector<std::shared_ptr<Sequence>> seqs;
  for (size_t i = 0; i < reqs.size(); ++i)
    seqs.push_back(std::make_shared<Sequence>(*model_, reqs[i], record_into(got[i])));
  Request huge = request("too long for the budget", 0, 15, 8);
  huge.max_tokens = int(model_->context()) - int(huge.prompt.size());
  ASSERT_GT(kv_reservation(*model_, huge, {}), budget);

  auto too_big = std::make_shared<Sequence>(*model_, huge, record_into(got.back()));
  for (auto& s : seqs) eng.add(s);
  eng.add(too_big);
  size_t most_running = 0;
  while (!eng.idle()) {
    eng.step();
    EXPECT_LE(eng.kv_reserved(), budget);
    EXPECT_LE(eng.kv_bytes(), eng.kv_reserved());
    most_running = std::max(most_running, eng.running());
  }
  EXPECT_GE(most_running, 1u);
  EXPECT_LT(most_running, reqs.size());
  EXPECT_EQ(eng.kv_reserved(), 0u);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].tokens, solo[i].tokens) << i;
    EXPECT_EQ(got[i].finishes, 1) << i;
  }
  EXPECT_EQ(got.back().reason, FinishReason::Error);
  EXPECT_NE(too_big->error().find("more than the whole KV memory budget"), std::string::npos) << too_big->error();
  EXPECT_TRUE(got.back().tokens.empty());
}

// An image encode runs one tower layer per step (vision_layers 1): a text request that arrives
// while it runs is prefilled and gets its first token before the encode ends, and both give
// their solo tokens and logits (the encode in pieces is bit-identical to the whole one; the
// prefill shares its pass with the other sequence's decode row).
TEST_F(EngineTest, TextArrivingDuringAnImageEncodeDoesNotWaitForIt) {
  const Request img = request("Describe both.", 2, 21, 5), txt = request("Quick question", 0, 22, 5);
  const Record solo_img = alone(img), solo_txt = alone(txt);
  Record a, b;
  Engine eng(*model_, StepBudget{.prefill_rows = 4096, .images = 1, .vision_layers = 1});
  auto sa = std::make_shared<Sequence>(*model_, img, record_into(a));
  auto sb = std::make_shared<Sequence>(*model_, txt, record_into(b));
  eng.add(sa);
  eng.step();
  ASSERT_EQ(sa->phase(), Phase::Encoding);
  eng.add(sb);
  int steps = 0;
  while (b.tokens.empty() && !eng.idle()) {
    const StepStats st = eng.step();
    EXPECT_LE(st.images, 1);
    ++steps;
  }
  EXPECT_EQ(sa->phase(), Phase::Encoding) << "the text request waited for the whole encode";
  EXPECT_EQ(steps, 1);  // its prefill runs in the first step after it arrives, before that step's layer
  eng.run_until_idle();
  EXPECT_EQ(a.tokens, solo_img.tokens);
  expect_logits_near(a, solo_img);
  EXPECT_EQ(b.tokens, solo_txt.tokens);
  expect_logits_near(b, solo_txt);
}

// The image cache (engine/image_cache.h). Counts the images a run encodes and takes from the
// cache, summed over its steps.
struct ImageCounts {
  int encoded = 0, cached = 0;
};
ImageCounts run_counting(Engine& eng) {
  ImageCounts c;
  while (!eng.idle()) {
    const StepStats st = eng.step();
    c.encoded += st.images;
    c.cached += st.images_cached;
  }
  return c;
}

// Logits equal to the bit: the same request in the same kind of step gives the same bits, so any
// difference in the rows a cached image contributes shows here.
void expect_same_bits(const Record& got, const Record& want) {
  EXPECT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.logits.size(), want.logits.size());
  for (size_t t = 0; t < got.logits.size(); ++t) EXPECT_TRUE(got.logits[t] == want.logits[t]) << "logits row " << t;
}

// An image sent again is not encoded again, and what follows is bit for bit what a fresh encode
// gives: the second turn of a chat about a picture, the same picture twice in one request, and
// a request whose images are all known.
TEST_F(EngineTest, ImageCacheReusesAnImageWithoutChangingABit) {
  const Request a = request("What is in this picture?", 1, 31), b = request("What is in this picture?", 1, 32);
  Request aba;  // a's image, b's, a's again
  aba.images = {a.images[0], b.images[0], a.images[0]};
  aba.prompt = model_->chat_prompt(std::vector<text::ChatMessage>{user_turn("Compare them.", 3)}, aba.images);
  aba.max_tokens = 8;
  aba.ignore_eos = true;
  const Record solo_a = alone(a), solo_b = alone(b), solo_aba = alone(aba);
  ASSERT_NE(solo_a.logits, solo_b.logits);  // the images matter to the logits

  Engine eng(*model_, StepBudget{.prefill_rows = 4096, .images = 8, .vision_layers = 0, .image_cache_bytes = 64u << 20});
  auto run = [&](const Request& req, ImageCounts want) {
    Record r;
    eng.add(std::make_shared<Sequence>(*model_, req, record_into(r)));
    const ImageCounts got = run_counting(eng);
    EXPECT_EQ(got.encoded, want.encoded);
    EXPECT_EQ(got.cached, want.cached);
    return r;
  };
  expect_same_bits(run(a, {1, 0}), solo_a);
  const size_t one = eng.image_cache_bytes();
  EXPECT_GT(one, 0u);
  expect_same_bits(run(a, {0, 1}), solo_a);
  expect_same_bits(run(b, {1, 0}), solo_b);
  EXPECT_EQ(eng.image_cache_bytes(), 2 * one);
  expect_same_bits(run(aba, {0, 3}), solo_aba);

  // Without a cache every image is encoded, the repeated one too.
  Engine plain(*model_, StepBudget{.prefill_rows = 4096, .images = 8, .vision_layers = 0});
  Record r;
  plain.add(std::make_shared<Sequence>(*model_, aba, record_into(r)));
  const ImageCounts got = run_counting(plain);
  EXPECT_EQ(got.encoded, 3);
  EXPECT_EQ(got.cached, 0);
  EXPECT_EQ(plain.image_cache_bytes(), 0u);
  expect_same_bits(r, solo_aba);
}

// With room for one image's rows, the least recently used image goes when another comes.
TEST_F(EngineTest, ImageCacheEvictsTheLeastRecentlyUsedImage) {
  const Request a = request("Describe.", 1, 41), b = request("Describe.", 1, 42);
  size_t one = 0;
  {
    Engine probe(*model_, StepBudget{.prefill_rows = 4096, .images = 8, .vision_layers = 0, .image_cache_bytes = 64u << 20});
    Record r;
    probe.add(std::make_shared<Sequence>(*model_, a, record_into(r)));
    run_counting(probe);
    one = probe.image_cache_bytes();
  }
  ASSERT_GT(one, 0u);
  Engine eng(*model_, StepBudget{.prefill_rows = 4096, .images = 8, .vision_layers = 2, .image_cache_bytes = one});
  auto encoded = [&](const Request& req) {
    Record r;
    eng.add(std::make_shared<Sequence>(*model_, req, record_into(r)));
    return run_counting(eng).encoded;
  };
  EXPECT_EQ(encoded(a), 1);
  EXPECT_EQ(encoded(a), 0);
  EXPECT_EQ(encoded(b), 1);  // a goes
  EXPECT_EQ(eng.image_cache_bytes(), one);
  EXPECT_EQ(encoded(b), 0);
  EXPECT_EQ(encoded(a), 1);
}

TEST(ImageCache, KeysTellPixelsAndShapesApart) {
  const vision::RgbImage im = noise_image(6, 4, 1);
  vision::RgbImage pixel = im, shape = im;
  pixel.rgb[17] ^= 1;
  shape.width = 4, shape.height = 6;  // the same bytes as another shape
  EXPECT_EQ(image_key(im), image_key(noise_image(6, 4, 1)));
  EXPECT_NE(image_key(im), image_key(pixel));
  EXPECT_NE(image_key(im), image_key(shape));
}

TEST(ImageCache, HoldsAtMostItsBytesAndDropsTheOldestFirst) {
  auto key = [](uint8_t k) {
    ImageKey x{};
    x[31] = k;  // keys that differ only past the bytes the index hashes
    return x;
  };
  const std::vector<float> rows(10, 1.5f);  // 40 bytes
  ImageCache c(100);
  c.put(key(1), rows);
  c.put(key(2), rows);
  ASSERT_NE(c.find(key(1)), nullptr);  // 1 is now the most recent
  c.put(key(3), rows);                 // 120 bytes > 100: 2 goes
  EXPECT_EQ(c.find(key(2)), nullptr);
  ASSERT_NE(c.find(key(1)), nullptr);
  EXPECT_EQ(*c.find(key(3)), rows);
  EXPECT_EQ(c.size(), 2u);
  EXPECT_EQ(c.bytes(), 80u);
  c.put(key(3), std::vector<float>(5, 2.f));  // a key already held keeps its rows
  EXPECT_EQ(*c.find(key(3)), rows);
  EXPECT_EQ(c.bytes(), 80u);
  c.put(key(4), std::vector<float>(26, 0.f));  // larger than the whole cache: not kept, nothing evicted
  EXPECT_EQ(c.find(key(4)), nullptr);
  EXPECT_EQ(c.size(), 2u);
  ImageCache none(0);
  none.put(key(1), rows);
  EXPECT_EQ(none.find(key(1)), nullptr);
  EXPECT_EQ(none.bytes(), 0u);
}

// The prefix cache (engine/prefix_cache.h): a request runs in `eng`, its counts of images encoded
// and taken from the image cache checked.
Record run_in(Engine& eng, const Model& m, const Request& req, ImageCounts want) {
  Record r;
  eng.add(std::make_shared<Sequence>(m, req, record_into(r)));
  const ImageCounts got = run_counting(eng);
  EXPECT_EQ(got.encoded, want.encoded);
  EXPECT_EQ(got.cached, want.cached);
  return r;
}

// The next turn of a chat whose turn `t` was answered with `answer`: t's prompt, the answer, then
// t's last 5 ids ("<end_of_turn>" ... "model\n") again.
Request next_turn(const Request& t, std::span<const int32_t> answer, int max_tokens) {
  Request next = t;
  next.prompt.insert(next.prompt.end(), answer.begin(), answer.end());
  next.prompt.insert(next.prompt.end(), t.prompt.end() - 5, t.prompt.end());
  next.max_tokens = max_tokens;
  return next;
}

// The largest |logit| difference between two runs' rows.
float logits_apart(const Record& a, const Record& b) {
  float worst = 0;
  for (size_t t = 0; t < std::min(a.logits.size(), b.logits.size()); ++t)
    worst = std::max(worst, row_apart(a.logits[t], b.logits[t]));
  return worst;
}

// The next turn of a chat: its prompt is the previous prompt, the previous answer and more. Its
// rows come from the finished sequence's cache (every position: the sliding layers' ring of 8
// has moved past the start, so only the whole sequence may be taken), its image is not encoded,
// and its tokens and logits are what it gives alone.
TEST_F(EngineTest, PrefixCacheStartsTheNextTurnFromThePreviousOne) {
  const Request t1 = request("What is in this picture?", 1, 51, 6);
  Engine eng(*model_, StepBudget{.prefill_rows = 4096, .images = 8, .vision_layers = 0, .prefix_cache_bytes = 256u << 20});
  const Record r1 = run_in(eng, *model_, t1, {1, 0});
  EXPECT_EQ(r1.usage.cached_tokens, 0);
  ASSERT_EQ(r1.tokens.size(), 6u);
  EXPECT_GT(eng.prefix_cache_bytes(), 0u);

  const Request t2 = next_turn(t1, r1.tokens, 5);
  const Record solo2 = alone(t2);
  const Record r2 = run_in(eng, *model_, t2, {0, 0});
  // Every position of t1's sequence: its prompt and the answer tokens forwarded, all but the last
  // (sampled when max_tokens was reached, never run through the decoder).
  EXPECT_EQ(r2.usage.cached_tokens, int(t1.prompt.size() + r1.tokens.size()) - 1);
  EXPECT_EQ(r2.tokens, solo2.tokens);
  expect_logits_near(r2, solo2);

  // t1 again: the finished sequences' rings no longer hold what its prompt needs, but the prompt
  // kept where its prefill ended does, with its last row's logits: nothing is computed, and the
  // answer is the first one to the bit.
  const Record again = run_in(eng, *model_, t1, {0, 0});
  EXPECT_EQ(again.usage.cached_tokens, int(t1.prompt.size()));
  expect_same_bits(again, r1);
  // Without that entry, the rows come from the log of positions that left a cache's rings: the
  // engine below holds a longer prompt's entries only, which give all of t1 but its last row,
  // computed again.
  Engine fresh(*model_, StepBudget{.prefill_rows = 4096, .images = 8, .vision_layers = 0, .prefix_cache_bytes = 256u << 20});
  Request longer = t1;
  longer.prompt.push_back(r1.tokens[0]);  // another prompt: kept at its end, never t1's
  run_in(fresh, *model_, longer, {1, 0});
  const Record part = run_in(fresh, *model_, t1, {0, 0});
  EXPECT_EQ(part.usage.cached_tokens, int(t1.prompt.size()) - 1);
  EXPECT_EQ(part.tokens, r1.tokens);
  expect_logits_near(part, r1);
}

// A next prompt that repeats the answer only in part (the template trims it; its text may
// tokenize otherwise): the rows the decode steps overwrote in the rings of 8 come from the log
// each sequence keeps (64 positions, KvCache::keep_overwritten), as far back as it reaches.
TEST_F(EngineTest, PrefixCacheTakesAPartOfTheAnswerFromTheOverwrittenRows) {
  const Request t1 = request("What is in this picture?", 1, 52, 75);
  Engine eng(*model_, StepBudget{.prefill_rows = 4096, .images = 8, .vision_layers = 0, .prefix_cache_bytes = 256u << 20});
  const Record r1 = run_in(eng, *model_, t1, {1, 0});
  ASSERT_EQ(r1.tokens.size(), 75u);  // 74 of them forwarded: the log holds positions 100 - 64 .. 99
  const size_t P = t1.prompt.size();
  for (const size_t answer : {size_t(20), size_t(70), size_t(5)}) {
    const Request t = next_turn(t1, std::span(r1.tokens).first(answer), 4);
    const Record solo = alone(t);
    const Record r = run_in(eng, *model_, t, {0, 0});
    // Positions [n - 8, n) are needed; the ring and the log hold 36 .. 107 of t1's sequence. Short
    // of that, t1's prompt kept where its prefill ended gives its P positions (the image's included).
    const size_t n = P + answer;
    EXPECT_EQ(r.usage.cached_tokens, n - 8 >= 36 ? int(n) : int(P)) << "answer tokens repeated: " << answer;
    EXPECT_EQ(r.tokens, solo.tokens);
    expect_logits_near(r, solo);
  }
}

// A chat front-end that edits its last message resends the conversation up to it. With
// Request::edit_from at that turn, the prompt kept where its prefill ended also kept the rows that
// left its rings (of 8) from there on, so the edited prompt takes every position up to where it
// differs; without it, the 64-row log does not reach back past a long message and nothing is taken.
// Prefill chunks of 4096 rows (the window's rows pass the rings), 16 and 5 (rows displaced from them).
TEST_F(EngineTest, PrefixCacheTakesAConversationUpToItsEditedLastMessage) {
  std::string words;
  for (int i = 0; i < 40; ++i) words += " and then the " + std::to_string(i) + "th thing";
  auto chat = [&](const std::string& last) {
    Request r = request("What is in this picture?", 1, 53, 3);
    const std::vector<text::ChatMessage> msgs{user_turn("What is in this picture?", 1),
                                              {"assistant", {{false, "Noise, mostly."}}},
                                              user_turn(last + words, 0)};
    r.prompt = model_->chat_prompt(msgs, r.images);
    r.edit_from = text::last_user_turn(msgs, r.prompt, *model_->tokenizer());
    return r;
  };
  const Request first = chat("Tell me more"), edited = chat("Say more");
  size_t differ = 0;
  while (first.prompt[differ] == edited.prompt[differ]) ++differ;
  ASSERT_GT(first.prompt.size() - size_t(first.edit_from), 64u + 8u);
  ASSERT_GT(differ, size_t(first.edit_from));
  const Record solo = alone(edited);
  for (const int rows : {4096, 16, 5}) {
    for (const bool hint : {true, false}) {
      Engine eng(*model_, StepBudget{.prefill_rows = rows, .images = 8, .vision_layers = 0, .prefix_cache_bytes = 256u << 20});
      Request a = first, b = edited;
      if (!hint) a.edit_from = b.edit_from = -1;
      run_in(eng, *model_, a, {1, 0});
      const Record r = run_in(eng, *model_, b, {hint ? 0 : 1, 0});
      EXPECT_EQ(r.usage.cached_tokens, hint ? int(differ) : 0) << rows << " rows a chunk";
      EXPECT_EQ(r.tokens, solo.tokens);
      expect_logits_near(r, solo);
    }
  }
}

// With rings that hold the whole conversation (sliding window 64): the same request takes every
// row (its prompt kept where its prefill ended); another image at the same place stops the prefix
// before that image's block; a request that keeps the first image and adds a second takes the
// first's rows and encodes only the second, whose rows then land in their own block.
TEST_F(EngineTest, PrefixCacheTakesWholeImagesThatAgreeOnly) {
  const Model& m = *wide_;
  const int32_t image_id = m.config().image_token_id;
  Engine eng(m, StepBudget{.prefill_rows = 4096, .images = 8, .vision_layers = 0, .prefix_cache_bytes = 256u << 20});
  const Request a = request("What is in this picture?", 1, 61, 4);
  const Record solo_a = alone(a, &m);
  expect_same_bits(run_in(eng, m, a, {1, 0}), solo_a);

  // The same request: its prompt kept where its prefill ended, with its last row's logits.
  const Record again = run_in(eng, m, a, {0, 0});
  EXPECT_EQ(again.usage.cached_tokens, int(a.prompt.size()));
  expect_same_bits(again, solo_a);

  const Request b = request("What is in this picture?", 1, 62, 4);  // the same ids, another image
  ASSERT_EQ(b.prompt, a.prompt);
  const Record solo_b = alone(b, &m);
  ASSERT_GT(logits_apart(solo_a, solo_b), 1e-3f);  // the images matter
  const Record rb = run_in(eng, m, b, {1, 0});
  const auto first_image = std::find(b.prompt.begin(), b.prompt.end(), image_id) - b.prompt.begin();
  EXPECT_EQ(rb.usage.cached_tokens, int(first_image));
  EXPECT_EQ(rb.tokens, solo_b.tokens);
  expect_logits_near(rb, solo_b);

  const Request ac = request_with({a.images[0]}, "What is in this picture?", 1, 63, 4);  // a's image, then another
  const Record solo_ac = alone(ac, &m);
  const Record rac = run_in(eng, m, ac, {1, 0});
  size_t agree = 0;
  while (agree < a.prompt.size() && a.prompt[agree] == ac.prompt[agree]) ++agree;
  ASSERT_GT(agree, size_t(first_image) + 16);  // past a's whole image block
  EXPECT_EQ(rac.usage.cached_tokens, int(agree));
  EXPECT_EQ(rac.tokens, solo_ac.tokens);
  expect_logits_near(rac, solo_ac);
}

// Pan & Scan: an image is a block and one per crop. The same request again takes all but its last
// row and encodes nothing; a request that keeps the image (with its crops) and adds another image
// takes every block of the first and encodes only the second, whose rows land in their blocks.
TEST_F(EngineTest, PrefixCacheTakesAnImageWithAllItsCrops) {
  const Model& m = *pans_;
  auto req = [&](std::vector<vision::RgbImage> images) {
    Request r;
    r.images = std::move(images);
    r.prompt = m.chat_prompt(std::vector<text::ChatMessage>{user_turn("Describe.", r.images.size())}, r.images);
    r.max_tokens = 4;
    r.ignore_eos = true;
    return r;
  };
  const vision::RgbImage wide_image = noise_image(900, 300, 71), other = noise_image(300, 900, 72);
  ASSERT_GE(m.crops_of({wide_image})[0], 2);  // the test needs crops
  const Request a = req({wide_image}), ab = req({wide_image, other});
  Engine eng(m, StepBudget{.prefill_rows = 4096, .images = 8, .vision_layers = 0, .prefix_cache_bytes = 256u << 20});
  const Record solo_a = alone(a, &m), solo_ab = alone(ab, &m);
  expect_same_bits(run_in(eng, m, a, {1, 0}), solo_a);

  // The same request: its prompt kept where its prefill ended, with its last row's logits.
  const Record again = run_in(eng, m, a, {0, 0});
  EXPECT_EQ(again.usage.cached_tokens, int(a.prompt.size()));
  expect_same_bits(again, solo_a);

  const Record rab = run_in(eng, m, ab, {1, 0});
  size_t agree = 0;
  while (agree < a.prompt.size() && a.prompt[agree] == ab.prompt[agree]) ++agree;
  // Taken: at most where the prompts part, and never into the first image's last block.
  const int32_t image_id = m.config().image_token_id;
  const size_t last_block_end = size_t(std::find(a.prompt.rbegin(), a.prompt.rend(), image_id) - a.prompt.rbegin());
  ASSERT_GT(agree, a.prompt.size() - last_block_end);
  EXPECT_EQ(rab.usage.cached_tokens, int(agree));
  EXPECT_EQ(rab.tokens, solo_ab.tokens);
  expect_logits_near(rab, solo_ab);
}

// Requests that run together and share a prefix (three questions about one image, one asked
// twice): the first computes the shared rows, the others wait for them and take them from its
// cache, prefilling only their own rows; the image is encoded once; every answer is its solo run.
TEST_F(EngineTest, RunningSequencesTakeTheRowsTheyShare) {
  const Model& m = *wide_;
  const Request a = request("Describe this picture.", 1, 71, 4);
  const Request same = a;
  const Request more = request_with({a.images[0]}, "Describe this picture in detail, please.", 0, 72, 4);
  size_t agree = 0;
  while (agree < a.prompt.size() && a.prompt[agree] == more.prompt[agree]) ++agree;
  const int32_t image_id = m.config().image_token_id;
  const auto past_image = std::find(a.prompt.rbegin(), a.prompt.rend(), image_id).base() - a.prompt.begin();
  ASSERT_GT(agree, size_t(past_image));  // the image block is shared
  ASSERT_LT(agree, more.prompt.size() - 1);
  Engine eng(m, StepBudget{.prefill_rows = 16, .images = 1, .vision_layers = 0, .image_cache_bytes = 64u << 20,
                           .prefix_cache_bytes = 256u << 20});
  Record ra, rs, rm;
  eng.add(std::make_shared<Sequence>(m, a, record_into(ra)));
  eng.add(std::make_shared<Sequence>(m, same, record_into(rs)));
  eng.add(std::make_shared<Sequence>(m, more, record_into(rm)));
  int rows = 0;
  ImageCounts images;
  while (!eng.idle()) {
    const StepStats st = eng.step();
    rows += st.prefill_rows;
    images.encoded += st.images;
    images.cached += st.images_cached;
  }
  EXPECT_EQ(images.encoded, 1);
  EXPECT_EQ(images.cached, 2);
  EXPECT_EQ(ra.usage.cached_tokens, 0);
  EXPECT_EQ(rs.usage.cached_tokens, int(a.prompt.size()) - 1);
  EXPECT_EQ(rm.usage.cached_tokens, int(agree));
  // Each prompt row computed once: a's, the last row of its twin, the rest of the longer question.
  EXPECT_EQ(rows, int(a.prompt.size() + 1 + more.prompt.size() - agree));
  for (const auto& [got, req] : {std::pair{&ra, &a}, {&rs, &same}, {&rm, &more}}) {
    const Record solo = alone(*req, &m);
    EXPECT_EQ(got->tokens, solo.tokens);
    expect_logits_near(*got, solo);
  }
}

TEST_F(EngineTest, PrefixCacheKeepsTheLatestTurnAndItsBytes) {
  const TextConfig& cfg = model_->config().text;
  auto cache_of = [&](int64_t n) {
    KvCache c(cfg, 64, DType::F32);
    c.reserve(n);
    c.advance(n);
    return c;
  };
  const size_t one = cache_of(4).bytes() + 4 * sizeof(int32_t);
  PrefixCache pc(2 * one + one / 2);  // room for two four-position entries
  pc.put({1, 2, 3, 4}, {}, cache_of(4));
  pc.put({1, 2, 5, 6}, {}, cache_of(4));
  EXPECT_EQ(pc.size(), 2u);
  pc.put({9, 9, 9, 9}, {}, cache_of(4));  // the least recently used ({1, 2, 3, 4}) goes
  EXPECT_EQ(pc.size(), 2u);
  EXPECT_LE(pc.bytes(), 2 * one + one / 2);
  KvCache into(cfg, 64, DType::F32);
  const std::vector<int32_t> next{1, 2, 5, 6, 7};
  PrefixCache::Match got = pc.find(next, {}, -1, into);
  EXPECT_EQ(got.positions, 4);
  got = pc.find(std::vector<int32_t>{1, 2, 3, 4, 8}, {}, -1, into);
  EXPECT_EQ(got.positions, 2);  // {1, 2, 3, 4} is gone; {1, 2, 5, 6} agrees on two
  // A continuation replaces the entry it continues, and only that one.
  PrefixCache big(size_t(1) << 30);
  big.put({1, 2, 5, 6}, {}, cache_of(4));
  big.put({7, 7}, {}, cache_of(2));
  big.put({1, 2, 5, 6, 7, 8}, {}, cache_of(6));
  EXPECT_EQ(big.size(), 2u);
  EXPECT_EQ(big.find(std::vector<int32_t>{1, 2, 5, 6, 7, 8, 9}, {}, -1, into).positions, 6);
  EXPECT_EQ(big.find(std::vector<int32_t>{7, 7, 7}, {}, -1, into).positions, 2);

  // Image blocks (runs of 99 here) are taken whole and with all of their image's blocks, or not at all.
  ImageKey k{};
  k[0] = 7;
  PrefixCache img(size_t(1) << 30);
  img.put({1, 99, 99, 99}, {BlockKey{k, 0, 1}}, cache_of(4));  // ends inside a block
  EXPECT_EQ(img.find(std::vector<int32_t>{1, 99, 99, 99, 99, 2}, std::vector<BlockKey>{{k, 0, 1}}, 99, into).positions, 1);
  const std::vector<BlockKey> crops{{k, 0, 2}, {k, 1, 2}};  // an image and its one crop
  img.put({3, 99, 99, 2}, {crops[0]}, cache_of(4));           // holds the image's first block only
  EXPECT_EQ(img.find(std::vector<int32_t>{3, 99, 99, 2, 99, 99, 5}, crops, 99, into).positions, 1);
  img.put({3, 99, 99, 2, 99, 99, 5}, crops, cache_of(7));
  EXPECT_EQ(img.find(std::vector<int32_t>{3, 99, 99, 2, 99, 99, 5, 6}, crops, 99, into).positions, 7);
}

// Drafts (StepBudget::draft_tokens, docs/gemma3/decoder.md "Drafts"): each sequence's answer is
// the one it gives without drafts, token for token, its logits within 1e-5 of the largest, greedy
// and sampled, with stop strings, in steps shared with other sequences' decode rows and prompt
// chunks; some draft ids are taken and some not, on rings of 8 that the checks wrap, so the rows a
// rejected draft overwrote come back from the log (KvCache::rewind).
TEST_F(EngineTest, DraftsGiveTheAnswerWithoutDrafts) {
  std::vector<Request> reqs = {
      request("Say it again and again and again and again", 0, 61, 40),
      request("What is in this picture?", 1, 62, 30),
      request("Repeat: one two three, one two three, one two three", 0, 63, 36),
      request("Hi", 0, 64, 25),
      request("Tell me a story about a story about a story", 0, 65, 60),
  };
  reqs[4].sampling.frequency_penalty = 0.5f;  // the repeats drafted are drawn less often
  reqs[1].sampling.temperature = 1.0f;
  reqs[1].sampling.seed = 7;
  reqs[3].sampling.temperature = 0.8f;
  reqs[3].sampling.top_k = 5;
  reqs[3].sampling.seed = 11;
  std::vector<Record> solo;
  for (const Request& r : reqs) solo.push_back(alone(r));

  std::vector<Record> got(reqs.size());
  // A fixed row cost, so the lengths checked (not the answers) are the same run to run.
  Engine eng(*model_, StepBudget{.prefill_rows = 24, .images = 1, .draft_tokens = 4, .draft_row_cost = 0.15});
  int drafted = 0, accepted = 0;
  for (size_t i = 0; i < reqs.size(); ++i) eng.add(std::make_shared<Sequence>(*model_, reqs[i], record_into(got[i])));
  while (!eng.idle()) {
    const StepStats st = eng.step();
    drafted += st.drafted;
    accepted += st.accepted;
  }
  std::printf("drafts: %d ids checked, %d taken\n", drafted, accepted);
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE("sequence " + std::to_string(i));
    EXPECT_EQ(got[i].finishes, 1);
    ASSERT_EQ(got[i].tokens, solo[i].tokens);
    EXPECT_EQ(got[i].text, solo[i].text);
    expect_logits_near(got[i], solo[i]);
  }
  EXPECT_GT(accepted, 0);
  EXPECT_GT(drafted, accepted);
}

// A draft's check ends where the answer does (a stop string within the drafted ids, max_tokens),
// and the finished sequence's cache holds its answer's rows only: the next turn of its chat takes
// them (PrefixCache) and gives the tokens it gives alone.
TEST_F(EngineTest, DraftsEndWithTheAnswerAndLeaveItsRowsToTheNextTurn) {
  const Request t1 = request("Say it again and again and again and again", 0, 61, 40);
  const Record plain = alone(t1);
  ASSERT_GT(plain.text.size(), 20u);
  Request stopped = t1;
  stopped.stop_strings = {plain.text.substr(plain.text.size() / 2, 4)};
  const Record solo_stopped = alone(stopped);
  ASSERT_EQ(solo_stopped.reason, FinishReason::Stop);
  // Drafts free of cost, so every step checks all the lookup finds: answers end inside them.
  const StepBudget drafts{.prefill_rows = 4096, .images = 8, .vision_layers = 0, .prefix_cache_bytes = 256u << 20,
                          .draft_tokens = 6, .draft_row_cost = 0};
  for (const Request& r : {stopped, t1}) {
    Engine eng(*model_, drafts);
    const Record got = run_in(eng, *model_, r, {0, 0});
    const Record& solo = r.stop_strings.empty() ? plain : solo_stopped;
    EXPECT_EQ(got.reason, solo.reason);
    ASSERT_EQ(got.tokens, solo.tokens);
    EXPECT_EQ(got.text, solo.text);
    expect_logits_near(got, solo);

    const Request t2 = next_turn(r, got.tokens, 5);
    const Record solo2 = alone(t2);
    const Record r2 = run_in(eng, *model_, t2, {0, 0});
    // Every position the first answer forwarded: all its tokens but the last (never forwarded,
    // or, after a stop string, forwarded in a draft row the cache kept).
    EXPECT_GE(r2.usage.cached_tokens, int(r.prompt.size() + got.tokens.size()) - 1);
    EXPECT_EQ(r2.tokens, solo2.tokens);
    expect_logits_near(r2, solo2);
  }
}

// Prompt lookup (engine/draft.h): the longest recurring tail n-gram (4, 3, then 2 ids), its most
// recent earlier occurrence, the ids after it, running on into the draft's own ids past the end,
// stopped at an id past the vocabulary limit.
TEST(Draft, LookupTakesTheIdsAfterTheLatestOccurrenceOfTheLongestTail) {
  using V = std::vector<int32_t>;
  // The tail 7 8 9 recurs once: after it came 1 2 3.
  EXPECT_EQ(lookup_draft(V{7, 8, 9, 1, 2, 3, 5, 7, 8, 9}, 3, 100), (V{1, 2, 3}));
  EXPECT_EQ(lookup_draft(V{7, 8, 9, 1, 2, 3, 5, 7, 8, 9}, 2, 100), (V{1, 2}));
  // 8 9 recurs twice: the later occurrence's continuation (4), not the earlier one's (1).
  EXPECT_EQ(lookup_draft(V{8, 9, 1, 6, 8, 9, 4, 6, 8, 9}, 1, 100), (V{4}));
  // The longer n-gram wins over a later shorter match: 5 8 9 at the start, 8 9 later.
  EXPECT_EQ(lookup_draft(V{5, 8, 9, 1, 0, 8, 9, 2, 5, 8, 9}, 1, 100), (V{1}));
  // A run repeating every two ids is drafted repeating past the end.
  EXPECT_EQ(lookup_draft(V{3, 4, 3, 4, 3, 4}, 5, 100), (V{3, 4, 3, 4, 3}));
  EXPECT_EQ(lookup_draft(V{6, 6, 6}, 4, 100), (V{6, 6, 6, 6}));
  // An image's soft tokens (at or past the limit) end it; an earlier occurrence may still give ids.
  EXPECT_EQ(lookup_draft(V{1, 2, 3, 2, 1, 2, 200, 200, 1, 2}, 3, 100), (V{3, 2, 1}));
  EXPECT_EQ(lookup_draft(V{1, 2, 200, 1, 2}, 3, 100), V{});
  // No recurring tail, too short, no room.
  EXPECT_EQ(lookup_draft(V{1, 2, 3, 4, 5}, 4, 100), V{});
  EXPECT_EQ(lookup_draft(V{1, 1}, 4, 100), V{});
  EXPECT_EQ(lookup_draft(V{}, 4, 100), V{});
  EXPECT_EQ(lookup_draft(V{7, 8, 9, 1, 7, 8, 9}, 0, 100), V{});
}

// DraftOdds checks the k with the most ids per step's time, (1 + p + … + p^k) / (1 + c·k).
TEST(Draft, OddsCheckWhatPaysForItsRows) {
  using V = std::vector<int32_t>;
  DraftOdds fresh;  // even odds: k = 1, 2, 3 give 1.5 / 1.15, 1.75 / 1.3, 1.875 / 1.45 a step
  EXPECT_EQ(fresh.length(8, 0.15), 2u);
  EXPECT_EQ(fresh.length(1, 0.15), 1u);
  EXPECT_EQ(fresh.length(8, 0.3), 1u);  // dearer rows, fewer: 1.5 / 1.3 against 1.75 / 1.6
  EXPECT_EQ(fresh.length(0, 0.15), 0u);
  EXPECT_EQ(fresh.length(8, 0.0), 8u);  // free rows: all of the lookup
  EXPECT_EQ(fresh.length(8, 1.0), 0u);  // a row as dear as a step: 1.5 / 2 < 1

  DraftOdds missing = fresh;
  for (int i = 0; i < 30; ++i) missing.record(4, 0);
  EXPECT_EQ(missing.length(8, 0.15), 0u);
  // Unchecked lookups whose first id the answer drew bring the drafts back: p = 0.19 after two,
  // (1 + p) / 1.15 > 1.
  DraftOdds back = missing;
  for (int i = 0; i < 2; ++i) {
    std::vector<int32_t> lookup{5, 6, 7};
    back.pick(lookup, 0.15);
    EXPECT_TRUE(lookup.empty());
    EXPECT_EQ(back.drawn(lookup, V{5, 9}), 0u);
  }
  std::vector<int32_t> lookup{5, 6, 7};
  back.pick(lookup, 0.15);
  EXPECT_EQ(lookup, V{5});
  EXPECT_EQ(back.drawn(lookup, V{5, 6}), 1u);
  for (int i = 0; i < 40; ++i) back.record(8, 8);
  EXPECT_EQ(back.length(8, 0.15), 8u);  // p near 1: 9 / 2.2 against 8 / 2.05 for 7

  // The ids after a miss count for nothing.
  DraftOdds a = fresh, b = fresh;
  a.record(8, 2);
  b.record(3, 2);
  for (double c : {0.05, 0.15, 0.3})
    for (size_t max : {2u, 5u, 8u}) EXPECT_EQ(a.length(max, c), b.length(max, c)) << c << " " << max;

  // A row's cost to each of R sequences decoding together: one · R / (1 + one · (R − 1)).
  EXPECT_DOUBLE_EQ(batch_row_cost(0.15, 1), 0.15);
  EXPECT_DOUBLE_EQ(batch_row_cost(0.15, 0), 0.15);
  EXPECT_DOUBLE_EQ(batch_row_cost(0.25, 8), 2.0 / 2.75);
}

// RowCost fits pass times T = a + b·R and gives b / (a + b); the prior until the rows vary, and
// as kRowCostPriorPasses passes after (about 50 passes weigh at most: (50·fit + 8·prior) / 58).
TEST(Draft, RowCostFitsThePassesTimed) {
  RowCost c(0.15);
  EXPECT_EQ(c.value(), 0.15);
  for (int i = 0; i < 50; ++i) c.pass(1, 0.100);  // one size only: no slope
  EXPECT_EQ(c.value(), 0.15);
  for (int i = 0; i < 200; ++i) {  // 80 ms + 20 ms a row: a row is 0.2 of a lone step
    const size_t rows = 1 + size_t(i % 5);
    c.pass(rows, 0.080 + 0.020 * double(rows));
  }
  EXPECT_NEAR(c.value(), (50 * 0.2 + 8 * 0.15) / 58, 1e-3);
  for (int i = 0; i < 400; ++i) {  // another file: 40 ms + 40 ms a row, 0.5; the old passes fade
    const size_t rows = 1 + size_t(i % 9);
    c.pass(rows, 0.040 + 0.040 * double(rows));
  }
  EXPECT_NEAR(c.value(), (50 * 0.5 + 8 * 0.15) / 58, 1e-3);
  RowCost noisy(0.15);  // longer passes with fewer rows: a fit of 0.02 at least, 4 passes (1 + .98 + .98² + .98³) to 8
  for (size_t rows : {1, 2, 3, 4}) noisy.pass(rows, 0.1 / double(rows));
  EXPECT_NEAR(noisy.value(), (3.8816 * 0.02 + 8 * 0.15) / 11.8816, 1e-3);
}

}  // namespace
}  // namespace vlm::engine
