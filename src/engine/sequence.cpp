#include "engine/sequence.h"

#include <algorithm>

#include "core/error.h"
#include "engine/model.h"

namespace vlm::engine {

std::string_view finish_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Error: return "error";
  }
  return "?";
}

std::string_view phase_name(Phase p) {
  switch (p) {
    case Phase::Queued: return "queued";
    case Phase::Encoding: return "encoding";
    case Phase::Prefill: return "prefill";
    case Phase::Decode: return "decode";
    case Phase::Finished: return "finished";
  }
  return "?";
}

Sequence::Sequence(const Model& model, Request req, Callbacks cb)
    : model_(&model), req_(std::move(req)), cb_(std::move(cb)) {}

size_t Sequence::kv_bytes() const {
  if (!cache_) return 0;
  size_t slots = 0;
  for (int l = 0; l < model_->config().text.num_layers; ++l) slots += cache_->visible(l, cache_->length());
  return slots * cache_->row_bytes() * 2;  // keys and values
}

std::vector<int32_t> Sequence::ids() const {
  std::vector<int32_t> out = req_.prompt;
  out.insert(out.end(), tokens_.begin(), tokens_.end());
  return out;
}

int64_t kv_positions(const Model& model, const Request& req) {
  if (req.prefilled) return req.prefilled->cache.context();
  return std::min<int64_t>(model.context(), int64_t(req.prompt.size()) + std::max(req.max_tokens, 1));
}

int64_t logged_rows(const Request& req, RowLog log) {
  const int64_t edited = int64_t(req.prompt.size()) - req.edit_from;
  const int64_t rows = std::max(log.overwritten, log.draft);
  if (log.overwritten == 0 || req.edit_from < 0 || edited > kMaxEditRows) return rows;
  return std::max(rows, edited);
}

size_t kv_reservation(const Model& model, const Request& req, RowLog log) {
  return KvCache::bytes_for(model.config().text, kv_positions(model, req), model.decoder().kv_dtype(),
                            logged_rows(req, log));
}

std::string kv_budget_error(const Model& model, const Request& req, size_t budget, RowLog log) {
  constexpr double MiB = 1024.0 * 1024.0;
  return fmt::format("the request needs {:.1f} MiB of KV cache for {} positions ({} prompt tokens + max_tokens {}), "
                     "more than the whole KV memory budget of {:.1f} MiB: lower max_tokens or raise the budget",
                     double(kv_reservation(model, req, log)) / MiB, kv_positions(model, req), req.prompt.size(),
                     req.max_tokens, double(budget) / MiB);
}

void validate_request(const Model& model, const Request& req) {
  if (req.max_tokens < 0) fail("max_tokens must be >= 0, got {}", req.max_tokens);
  if (req.top_logprobs < -1) fail("top_logprobs must be >= 0, got {}", req.top_logprobs);
  if (req.top_logprobs > model.vocab_limit())
    fail("top_logprobs {} exceeds the vocabulary of {}", req.top_logprobs, model.vocab_limit());
  if (req.prompt_logprobs < -1 || req.prompt_logprobs > model.vocab_limit())
    fail("prompt_logprobs must be in [-1, {}], got {}", model.vocab_limit(), req.prompt_logprobs);
  // A scored prompt token is one the model can answer with (logprobs are over those ids).
  for (size_t i = 1; req.prompt_logprobs >= 0 && i < req.prompt.size(); ++i)
    if (req.prompt[i] >= model.vocab_limit())
      fail("prompt token {} (at {}) is not one the model answers with (ids below {}), so it has no logprob",
           req.prompt[i], i, model.vocab_limit());
  validate(req.sampling);
  if (req.min_tokens < 0 || req.min_tokens > req.max_tokens)
    fail("min_tokens must be in [0, max_tokens = {}], got {}", req.max_tokens, req.min_tokens);
  for (int32_t id : req.stop_ids)
    if (id < 0 || id >= model.vocab()) fail("stop id {} is outside the vocabulary [0, {})", id, model.vocab());
  if (!req.stop_strings.empty() && !model.tokenizer())
    fail("stop strings need a tokenizer, and {} has no tokenizer.json", model.dir().string());
  if (req.response_schema && !model.tokenizer())
    fail("response formats need a tokenizer, and {} has no tokenizer.json", model.dir().string());
  if (req.prompt.empty()) fail("the prompt has no tokens");
  const int V = model.vocab();
  for (size_t i = 0; i < req.prompt.size(); ++i)
    if (req.prompt[i] < 0 || req.prompt[i] >= V)
      fail("prompt token {} (at {}) is outside the vocabulary [0, {})", req.prompt[i], i, V);
  if (req.prefilled) {
    if (req.prefilled->cache.length() <= 0 || req.prefilled->cache.length() > model.context())
      fail("prefilled cache of {} positions outside (0, {}]", req.prefilled->cache.length(), model.context());
    if (req.prefilled->logits.size() != size_t(V))
      fail("prefilled logits have {} entries, expected {}", req.prefilled->logits.size(), V);
    return;
  }
  model.crops_of(req.images);  // images need the vision tower
  check_prompt(model.config(), model.vision(), req.prompt, req.images, model.host_options());
}

}  // namespace vlm::engine
