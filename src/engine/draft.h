// Drafts by prompt lookup (vLLM's "ngram" speculator, llama.cpp's ngram-simple): text that a
// sequence repeats (code being edited, a quoted document, JSON keys) tends to go on as it went
// before. The engine checks a draft in the sequence's next pass and keeps what its sampler draws
// (docs/gemma3/decoder.md, "Drafts").
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace vlm::engine {

// The n-grams matched, longest first: the last kDraftNgramMax ids down to the last kDraftNgramMin.
inline constexpr size_t kDraftNgramMax = 4, kDraftNgramMin = 2;

// Where the last n ids of `ids` (n from kDraftNgramMax down to kDraftNgramMin) appeared before,
// most recently, the at most `max_tokens` ids that followed them there (where those reach the
// end, the draft's own ids go on: a run that repeats every few ids is drafted repeating); ids at
// or past `vocab_limit` (image soft tokens) end the draft. Empty when no n-gram recurs.
std::vector<int32_t> lookup_draft(std::span<const int32_t> ids, size_t max_tokens, int32_t vocab_limit);

// How many of `draft` the answer drew in order: the length of the start they share.
size_t agreed(std::span<const int32_t> draft, std::span<const int32_t> draws);

// How many of a lookup's ids to check. A check of k ids costs about 1 + c·k plain steps (c: a
// draft row's cost against the step) and gives 1 + p + … + p^k ids where the answer takes each
// id with odds p after taking those before it; DraftOdds keeps p from what the answer took and
// checks the k that gives the most ids per step's time: fewer where drafts miss (prose, where a
// fixed 4 made decode slower), up to the most allowed where they are taken (code being edited).
class DraftOdds {
 public:
  // Cuts a lookup's ids to those worth checking this step (length), maybe none.
  void pick(std::vector<int32_t>& lookup, double row_cost);
  // After the step: the ids `checked` (pick's) against those the answer drew from the step on;
  // how many of them it took. Where pick left none, the lookup's first id is compared with the
  // first draw, so that odds that fell to nothing can rise again.
  size_t drawn(std::span<const int32_t> checked, std::span<const int32_t> draws);

  // The k in [0, max] with the most ids expected per step's time; 0 where a plain step gives more.
  size_t length(size_t max, double row_cost) const;
  // A check of `checked` ids whose first `taken` the answer took. The ids after a miss tell
  // nothing, and older checks weigh less (kDraftOddsDecay an id), so p follows the text.
  void record(size_t checked, size_t taken);

 private:
  double ids_ = 1, taken_ = 0.5;  // decayed counts; a prior of one id at even odds
  int32_t unchecked_ = -1;        // the first id of a lookup pick left out
};
inline constexpr double kDraftOddsDecay = 0.9;

// A decode row's cost against a lone sequence's step, from the engine's own passes: the time of a
// pass of R decode rows fitted as a + b·R by least squares over recent passes (each weighing
// kRowCostDecay of the next), the cost b / (a + b). It differs by file and machine (on the Zen 5
// VM 0.13 for the bf16 4B, 0.4–0.6 for its Q8_0 and Q4_K_M files: docs/gemma3/decoder.md,
// "Drafts"). `prior` stands until passes of different sizes were timed, and weighs as
// kRowCostPriorPasses passes after (one slow pass among a few must not set the cost alone).
class RowCost {
 public:
  explicit RowCost(double prior) : prior_(prior) {}
  void pass(size_t rows, double seconds);
  double value() const;

 private:
  double prior_, w_ = 0, r_ = 0, rr_ = 0, t_ = 0, rt_ = 0;  // decayed sums of 1, R, R², T, R·T
};
inline constexpr double kRowCostDecay = 0.98, kRowCostPriorPasses = 8;
// The cost a RowCost starts from: a row of the bf16 4B on the Zen 5 VM, about the cheapest seen
// (checks start long and shorten as the passes are timed).
inline constexpr double kDraftRowCostPrior = 0.15;

// A draft row's cost against the step of each of `rows` sequences decoding together, where one
// draft row costs `one` of a lone sequence's step: a pass of R rows takes about 1 + one·(R − 1)
// lone steps, shared by R answers, so a row costs each answer's step one·R / (1 + one·(R − 1)).
double batch_row_cost(double one, size_t rows);

}  // namespace vlm::engine
