// One request and its state while an Engine runs it: prompt ids and images in, tokens and text
// out through callbacks. The Engine alone mutates a Sequence (on its driving thread); other
// threads may call cancel() and read phase() at any time.
#pragma once
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "engine/draft.h"
#include "models/kv_cache.h"
#include "engine/image_cache.h"
#include "engine/sampler.h"
#include "engine/stop.h"
#include "grammar/matcher.h"
#include "models/gemma3/vision_encoder.h"
#include "text/detokenizer.h"
#include "vision/image.h"

namespace vlm::engine {

class Model;

enum class FinishReason { Stop, Length, Cancelled, Error };
std::string_view finish_name(FinishReason r);  // "stop" | "length" | "cancelled" | "error"

enum class Phase { Queued, Encoding, Prefill, Decode, Finished };
std::string_view phase_name(Phase p);  // "queued" | "encoding" | "prefill" | "decode" | "finished"

// A prefill computed elsewhere (a prompt cache file, vlm dump's observed prefill): the KV cache
// after the prompt and the logits of its last row. A sequence given one starts in Decode.
struct Prefilled {
  KvCache cache;
  std::vector<float> logits;
};

struct Request {
  std::vector<int32_t> prompt;           // final ids, images expanded (Model::chat_prompt/raw_prompt)
  std::vector<vision::RgbImage> images;  // in prompt order, decoded and validated
  SamplingParams sampling;               // vocab_limit 0: the model's vocab_limit()
  int max_tokens = 256;
  bool ignore_eos = false;                // the config's eos ids do not end the answer
  std::vector<int32_t> stop_ids;          // more ids that end it (vLLM's stop_token_ids), not in its text
  std::vector<std::string> stop_strings;  // need the model's tokenizer
  bool include_stop_string = false;       // the matched stop string ends the text (vLLM's include_stop_str_in_output)
  // No stop id or stop string ends an answer of fewer tokens (vLLM's min_tokens): the stop ids
  // are masked out of the draw before, and a stop string must end in a later token's text.
  int min_tokens = 0;
  int top_logprobs = -1;                 // -1: no logprobs; else logprob + this many alternatives
  // -1: none; else each prompt token after the first with its logprob given the tokens before it
  // and this many alternatives (OpenAI's echo with logprobs; lm-evaluation-harness's
  // loglikelihood). Such a prompt computes every row itself (no prefix taken from others) and its
  // chunks are at most kPromptLogprobRows rows (each row's logits are a vocabulary of floats).
  int prompt_logprobs = -1;
  // The answer is JSON that matches this (docs/structured-output.md); null: any text. Needs the
  // model's tokenizer. The answer ends (Stop) once the JSON is whole and nothing can follow it.
  std::shared_ptr<const grammar::Schema> response_schema;
  // A prompt cache file: when it holds this request under the model's identity the prefill is
  // restored from it (no vision tower, no prefill); otherwise it is written after the prefill. A
  // file made under another identity fails the request, naming the differing fields.
  std::filesystem::path prompt_cache;
  std::shared_ptr<Prefilled> prefilled;  // skip encoding and prefill (consumed on admission)
  // Where a later prompt is likely to part from this one (a chat's last user turn: the same
  // conversation with that message edited or asked again); -1: near its end. With a prefix cache,
  // the prompt kept where its prefill ended then gives back every prefix from there
  // (logged_rows; at most kMaxEditRows before the prompt's end).
  int64_t edit_from = -1;
};

// What ended an answer that finished with Stop, when the request named it (vLLM's stop_reason):
// one of its stop ids or stop strings. Neither (monostate): the model's own end, an eos id or a
// whole JSON answer.
using StopReason = std::variant<std::monostate, int32_t, std::string>;

struct Usage {
  int prompt_tokens = 0;      // image soft tokens included
  int image_tokens = 0;
  int completion_tokens = 0;  // tokens reported through on_token (a final stop id excluded)
  int cached_tokens = 0;      // prompt tokens restored from a prompt cache file or the prefix cache
  int draft_tokens = 0;       // draft ids checked (StepBudget::draft_tokens)
  int draft_accepted = 0;     // of them, those the answer took
};

struct TokenEvent {
  int32_t id = -1;
  std::string text;   // this token's own text (streaming detokenizer; empty without a tokenizer)
  float logprob = 0;  // log-softmax of the raw logits (Request::top_logprobs >= 0)
  int rank = 0;       // 1 + the ids whose raw logit is larger (vLLM's rank)
  std::vector<std::pair<int32_t, float>> top;  // the top_logprobs most likely ids, best first
};

// Called on the engine's thread; must not block for long.
struct Callbacks {
  std::function<void(const TokenEvent&)> on_token;  // every generated token
  // Every prompt token after the first, in order, as its chunk is computed (prompt_logprobs).
  std::function<void(const TokenEvent&)> on_prompt_token;
  // The user-visible text stream: detokenized, stop strings cut, nothing past a stop string.
  std::function<void(std::string_view)> on_text;
  // Every logits row a token is sampled from (the prompt's last row, then one per decode step),
  // before any penalty or masking. For dumps and tests.
  std::function<void(std::span<const float>)> on_logits;
  // Exactly once, also for a request that fails admission (Error; see Sequence::error()).
  std::function<void(FinishReason, const Usage&)> on_finish;
};

class Sequence {
 public:
  Sequence(const Model& model, Request req, Callbacks cb = {});
  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;

  // Thread-safe. The engine drops the sequence at its next step (in any phase), frees its KV
  // cache and calls on_finish(Cancelled) unless it finished already.
  void cancel() { cancel_.store(true, std::memory_order_relaxed); }
  bool cancel_requested() const { return cancel_.load(std::memory_order_relaxed); }
  Phase phase() const { return phase_.load(std::memory_order_acquire); }  // thread-safe

  const Model& model() const { return *model_; }
  // Read these on the engine's thread, or after on_finish.
  const Request& request() const { return req_; }
  const Usage& usage() const { return usage_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }  // generated ids
  // The ids at its positions: the prompt, then the generated ids (the KV cache holds the first
  // of them; the last sampled one is not in it yet).
  std::vector<int32_t> ids() const;
  FinishReason finish_reason() const { return finish_; }
  const StopReason& stop_reason() const { return stop_reason_; }
  const std::string& error() const { return error_; }  // the message when finish_reason() is Error
  size_t kv_bytes() const;                              // KV memory held now

 private:
  friend class Engine;

  const Model* model_;
  Request req_;
  Callbacks cb_;
  std::atomic<bool> cancel_{false};
  std::atomic<Phase> phase_{Phase::Queued};
  Usage usage_;
  std::vector<int32_t> tokens_;
  FinishReason finish_ = FinishReason::Length;
  StopReason stop_reason_;
  std::string error_;

  // Engine state.
  std::vector<int32_t> stop_ids_;  // the config's eos ids (unless ignore_eos), then the request's
  // Whether the answer's token number `n` (from 1) may end it: past min_tokens.
  bool may_stop_at(size_t n) const { return n > size_t(req_.min_tokens); }
  std::optional<KvCache> cache_;
  std::optional<Sampler> sampler_;
  std::optional<text::StreamDecoder> detok_;
  std::optional<StopStrings> stops_;
  std::optional<grammar::Matcher> matcher_;  // the response schema's state after the tokens so far
  std::vector<int> crops_;                  // per image
  size_t images_done_ = 0;                  // images encoded so far
  std::vector<ImageKey> image_keys_;        // per image, where the engine keeps an image cache
  std::optional<vision::VisionEncoder::Job> encode_;  // the image being encoded, between steps
  std::vector<float> features_;             // projector rows of the encoded images, in order
  size_t taken_image_rows_ = 0;             // image rows among the positions taken from the prefix cache
  std::vector<float> rows_;                 // [prompt, H] merged prefill rows (built once encoded)
  size_t prefilled_rows_ = 0;               // prompt rows already in the cache
  std::vector<float> logits_;               // the row to sample from next (after a draft: its rows)
  int32_t pending_ = -1;                    // sampled, not yet forwarded
  std::vector<int32_t> draft_;              // ids forwarded after pending_ in this step (Engine::draft)
  size_t draft_base_ = 0;                   // tokens_.size() when drafted: where the draws begin
  DraftOdds draft_odds_;                    // how often the answer took draft ids: how many to check
  uint64_t request_hash_ = 0;               // prompt cache key
  size_t kv_reserved_ = 0;                  // KV memory reserved at admission (kv_reservation)
};

// Checks a request against a model before any compute (ids in range, images vs soft tokens and
// crops, context, sampling parameters, stop strings need a tokenizer); throws Error with a one-
// line message naming both numbers. The engine runs it on admission; a server may call it first
// to answer 400 at once.
void validate_request(const Model& model, const Request& req);

// The most prompt rows a chunk takes when the request wants prompt logprobs: 64 rows of logits
// (67 MB for Gemma 3's vocabulary) instead of one.
constexpr size_t kPromptLogprobRows = 64;

// The log-softmax of `logits` (raw, in double) at `id` into ev.logprob, its rank into ev.rank,
// and the `k` most likely ids, best first (ties: the lower id), into ev.top.
void logprobs_of(std::span<const float> logits, int32_t id, int k, TokenEvent& ev);

// What an engine keeps of the positions that leave a sequence's sliding-layer rings
// (KvCache::keep_overwritten; StepBudget::row_log).
struct RowLog {
  int64_t overwritten = 0;  // for the prefix cache: the last this many (0: none)
  int64_t draft = 0;        // for drafts: the most rows a step gives back (KvCache::rewind)
};
// The positions a request's cache keeps: the more of log.draft and log.overwritten, or, with the
// latter, from Request::edit_from to the prompt's end where that is more and at most kMaxEditRows.
inline constexpr int64_t kMaxEditRows = 1024;
int64_t logged_rows(const Request& req, RowLog log);
// The positions a request may ever hold (its prompt plus max_tokens, within the model's context)
// and the KV memory that takes with its logged_rows: what the engine reserves before admitting it.
int64_t kv_positions(const Model& model, const Request& req);
size_t kv_reservation(const Model& model, const Request& req, RowLog log);
// The one-line refusal of a request whose reservation exceeds a whole budget of `budget` bytes.
std::string kv_budget_error(const Model& model, const Request& req, size_t budget, RowLog log);

}  // namespace vlm::engine
