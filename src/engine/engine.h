// The engine: advances many sequences together, one step at a time. Each step runs ONE pass over
// the decoder weights (models::gemma3::Decoder::forward, the batch door) that holds a decode row for every running sequence plus prompt chunks of
// sequences being prefilled (rows packed with their positions and sequence ids, logits only for
// the rows that need them), within a row budget. An image block is never split across chunks
// (its rows attend to each other); under the mlx mask mode the whole prompt is one chunk. Image
// encoding is its own work, after the step's pass: up to StepBudget::vision_layers tower layers
// (and StepBudget::images images) per step, all of a sequence's images before its prefill.
//
// What earlier sequences computed is kept for later ones where StepBudget asks for it: the
// projector rows of images (ImageCache) and finished sequences' KV caches (PrefixCache), so the
// next turn of a chat neither encodes its images nor prefills its conversation again.
//
// One thread drives an Engine (step()); add() and Sequence::cancel() may be called from any
// thread. Callbacks run on the driving thread.
#pragma once
#include <atomic>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "engine/draft.h"
#include "engine/image_cache.h"
#include "engine/model.h"
#include "engine/prefix_cache.h"
#include "engine/sequence.h"
#include "models/gemma3/activations.h"

namespace vlm::engine {

struct StepBudget {
  int prefill_rows = 512;  // prompt rows per step (an image block larger than this still fits whole)
  int images = 1;          // image encodes per step (an image with its Pan & Scan crops is one)
  // Vision tower layers per step (0 = whole images): a long encode runs in pieces, so other
  // sequences' steps (and requests that arrive meanwhile) run between them.
  int vision_layers = 2;
  int max_seqs = 0;        // sequences past the queue at once (0 = no limit)
  // KV memory of admitted sequences at most (0 = no limit). Each is admitted with the most its
  // cache can ever hold (kv_reservation: prompt plus max_tokens), so a running sequence never
  // waits for memory and nothing is preempted; the queue's head waits until it fits.
  size_t kv_bytes = 0;
  // Projector rows of recently encoded images kept for reuse (ImageCache; 0 = none): an image
  // sent again (every turn of a chat about it) skips the vision tower.
  size_t image_cache_bytes = 0;
  // KV caches of finished sequences kept for later prompts that begin the same way (PrefixCache;
  // 0 = none): each turn of a chat resends the conversation, which then is not prefilled again.
  size_t prefix_cache_bytes = 0;
  // Draft ids a decoding sequence checks per step at most (0 = none): where the answer's last few
  // ids appeared before, the ids that followed them (lookup_draft). They ride in the step's pass
  // after the sequence's own row, within what prompt chunks leave of prefill_rows, and the answer
  // takes them as far as its sampler draws them, so it is the answer without drafts, in fewer steps.
  int draft_tokens = 0;
  // A draft row's cost against a lone sequence's plain step, from which each sequence checks as
  // many of its lookup's ids as its answer's odds pay for (DraftOdds): unset, measured from the
  // engine's passes (RowCost, from kDraftRowCostPrior); 0: always all of them.
  std::optional<double> draft_row_cost = std::nullopt;
  // What each sequence keeps of the rows that leave its sliding layers' rings (part of its
  // reservation): with a prefix cache the last 64, so that a next prompt that repeats all of the
  // answer but its last 64 tokens (a trimmed newline, another tokenization of its end) still takes
  // the rows; with drafts, the rows a draft's check overwrote (KvCache::rewind).
  RowLog row_log() const { return {prefix_cache_bytes > 0 ? 64 : 0, draft_tokens}; }
};

struct StepStats {
  int decode_rows = 0;   // running sequences that got a decode row
  int prefill_rows = 0;  // prompt rows prefilled
  int prefill_seqs = 0;  // sequences that got a prompt chunk
  int images = 0;        // images encoded
  int images_cached = 0; // images whose rows came from the image cache
  int admitted = 0;      // sequences that left the queue
  int finished = 0;      // sequences that finished (any reason)
  int drafted = 0;       // draft ids checked
  int accepted = 0;      // draft ids the answers took
};

class Engine {
 public:
  explicit Engine(const Model& model, StepBudget budget = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const Model& model() const { return model_; }
  const StepBudget& budget() const { return budget_; }
  // What a draft row costs against a lone step: StepBudget::draft_row_cost, else as measured.
  double draft_row_cost() const { return budget_.draft_row_cost.value_or(row_cost_.value()); }

  // Thread-safe. Queues the sequence; the next step validates it (validate_request) and either
  // admits it or finishes it with FinishReason::Error before any compute.
  void add(std::shared_ptr<Sequence> seq);
  // One step (see above). Does nothing when idle.
  StepStats step();
  // Steps until every sequence added so far has finished.
  void run_until_idle();

  bool idle() const { return running() == 0 && waiting() == 0; }  // thread-safe
  size_t running() const { return running_.load(); }  // admitted, not finished (thread-safe)
  size_t waiting() const { return waiting_.load(); }  // added, not yet admitted (thread-safe)
  size_t kv_bytes() const { return kv_bytes_.load(); }  // KV memory of running sequences (thread-safe)
  size_t kv_reserved() const { return kv_reserved_.load(); }  // their reservations (thread-safe)
  size_t image_cache_bytes() const { return image_cache_bytes_.load(); }  // rows held (thread-safe)
  size_t prefix_cache_bytes() const { return prefix_cache_bytes_.load(); }  // caches held (thread-safe)

 private:
  struct Chunk;
  void admit(StepStats& st);
  bool start(Sequence& s);                  // admission work: validate, prompt cache, sampler
  void take_prefix(Sequence& s);            // rows from the prefix cache, and the images they hold
  bool takes_prefixes(const Sequence& s) const;  // the prefix cache may give it rows and keep its prompt
  bool restore_prompt(Sequence& s);         // the same prompt kept where its prefill ended: decode now
  void keep_prompt(Sequence& s);            // its prefill ended: its cache and logits to the prefix cache
  bool share_prefix(Sequence& s);           // rows of running sequences; true: wait for an earlier one
  bool whole_prompt() const;                // the mask mode makes every prompt row see every other
  void encode_images(StepStats& st);
  void forward(const std::vector<Sequence*>& decode, const std::vector<Chunk>& chunks);
  void non_finite(const std::vector<Sequence*>& decode, const std::vector<Chunk>& chunks);
  void sample(Sequence& s);                 // from s.logits_: emit a token or finish
  size_t draft(Sequence& s, size_t rows, size_t decode_rows);  // s.draft_ for this step, at most `rows` ids; their number
  void sample_draft(Sequence& s, StepStats& st);  // sample, and through s.draft_ as far as the draws agree
  void drop_draft(Sequence& s);             // the rows of draft ids the answer did not take leave the cache
  void finish(Sequence& s, FinishReason r);
  void fail_request(Sequence& s, const std::string& message);
  void update_counters();

  const Model& model_;
  StepBudget budget_;
  std::mutex inbox_mu_;
  std::deque<std::shared_ptr<Sequence>> inbox_;   // added, not yet validated
  std::deque<std::shared_ptr<Sequence>> queue_;   // validated, waiting for a slot
  std::vector<std::shared_ptr<Sequence>> active_;  // admitted, in order of admission
  std::atomic<size_t> running_{0}, waiting_{0}, kv_bytes_{0}, kv_reserved_{0}, image_cache_bytes_{0},
      prefix_cache_bytes_{0};
  ImageCache image_cache_;
  PrefixCache prefix_cache_;
  RowCost row_cost_{kDraftRowCostPrior};  // timed passes of decode rows alone
  // The pass's work state and inputs, kept between steps (they only grow).
  std::unique_ptr<models::gemma3::Activations> act_;
  std::vector<float> embeds_, logits_;
  std::vector<int64_t> pos_;
  std::vector<int32_t> seq_, ids_;
  std::vector<uint8_t> want_;
  std::vector<models::SeqSlot> slots_;
  static constexpr int kFinite = -1, kBadInput = -2;
  std::vector<int> bad_layer_;  // per slot: the first layer whose output held NaN/Inf, or the above
};

}  // namespace vlm::engine
