#include "engine/generate.h"

#include <algorithm>

#include "core/error.h"
#include "core/tensor.h"
#include "multimodal/merge.h"

namespace vlm {

std::string_view finish_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
  }
  return "?";
}

StopStrings::StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string StopStrings::feed(std::string_view piece) {
  if (stopped_) return {};
  held_ += piece;
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Keep the longest tail that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& s : stops_)
    for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n)
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopStrings::flush() {
  std::string out;
  if (!stopped_) out.swap(held_);
  return out;
}

namespace {
void check_options(const GenerateOptions& opt, const GenerateIO& io) {
  if (opt.max_tokens < 0) fail("max_tokens must be >= 0, got {}", opt.max_tokens);
  if (!opt.stop_strings.empty() && !io.piece) fail("stop strings need a detokenizer");
}

// The context a request runs with; a prompt that does not fit fails before any compute.
int64_t checked_context(const TextConfig& c, const GenerateOptions& opt, const GenerateIO& io,
                        int64_t prompt_len) {
  check_options(opt, io);
  if (opt.context < 0) fail("context {} must be > 0 (0 = max_position_embeddings)", opt.context);
  if (opt.context > c.max_position_embeddings)
    fail("context {} exceeds max_position_embeddings {}", opt.context, c.max_position_embeddings);
  const int64_t context = opt.context > 0 ? opt.context : c.max_position_embeddings;
  if (prompt_len > context) fail("prompt of {} tokens exceeds the context limit of {}", prompt_len, context);
  return context;
}
}  // namespace

GenerateResult generate(Gemma3& model, std::span<const int32_t> prompt, const GenerateOptions& opt,
                        const GenerateIO& io) {
  const TextConfig& c = model.config();
  if (prompt.empty()) fail("the prompt has no tokens");
  checked_context(c, opt, io, int64_t(prompt.size()));  // before embedding anything
  return generate(model, text_prefill(model.embedder(), prompt, int(prompt.size()), c.sliding_window, 0),
                  prompt, opt, io);
}

GenerateResult generate(Gemma3& model, const PrefillInput& in, std::span<const int32_t> prompt,
                        const GenerateOptions& opt, const GenerateIO& io,
                        const std::function<void(KvCache&, std::span<const float>)>& on_prefill) {
  const int64_t context = checked_context(model.config(), opt, io, in.valid_len);
  KvCache cache = model.new_cache(context);
  // NaN/Inf anywhere (weights, config values, inputs) would otherwise give garbage tokens
  // silently; the layer outputs are checked as they pass, so the error names the first.
  const size_t valid = size_t(in.valid_len) * size_t(model.config().hidden_size);
  if (size_t i = first_non_finite({in.embeds.data(), valid}); i < valid)
    fail("non-finite value (NaN/Inf) in the input embeddings at row {}", i / size_t(model.config().hidden_size));
  int bad_layer = -1;
  PrefillOptions po;
  po.on_layer = [&](int layer, const float* h) {
    if (bad_layer < 0 && first_non_finite({h, valid}) < valid) bad_layer = layer;
  };
  std::vector<float> logits = model.prefill_from_embeddings(in, cache, po);
  if (bad_layer >= 0)
    fail("non-finite values (NaN/Inf) after the prefill: decoder layer {} was the first to output them "
         "(check the weights and config.json)", bad_layer);
  if (first_non_finite(logits) < logits.size())
    fail("non-finite logits (NaN/Inf) after the prefill, though every decoder layer's output was finite "
         "(check the final norm and the output head)");
  if (on_prefill) on_prefill(cache, logits);
  return generate_from(model, cache, std::move(logits), prompt, opt, io);
}

GenerateResult generate_from(Gemma3& model, KvCache& cache, std::vector<float> logits,
                             std::span<const int32_t> prompt, const GenerateOptions& opt,
                             const GenerateIO& io) {
  // A resumed (saved) prefill meets the limits a fresh prompt does.
  checked_context(model.config(), opt, io, cache.length());
  const int64_t context = cache.context();

  Sampler sampler(opt.sampling);
  sampler.add_prompt(prompt);
  StopStrings stops(opt.stop_strings);
  GenerateResult res;
  res.prompt_tokens = int(prompt.size());
  auto emit = [&](const std::string& t) {
    if (t.empty()) return;
    res.text += t;
    if (io.on_text) io.on_text(t);
  };

  for (;;) {
    if (io.cancel && io.cancel->load()) {
      res.finish = FinishReason::Cancelled;
      break;
    }
    if (int(res.tokens.size()) >= opt.max_tokens) {
      res.finish = FinishReason::Length;
      break;
    }
    const int32_t id = sampler.sample(logits);
    if (std::find(opt.stop_ids.begin(), opt.stop_ids.end(), id) != opt.stop_ids.end()) {
      res.finish = FinishReason::Stop;
      break;
    }
    res.tokens.push_back(id);
    if (io.on_token) io.on_token(id);
    if (io.piece) {
      emit(stops.feed(io.piece(id)));
      if (stops.stopped()) {
        res.finish = FinishReason::Stop;
        break;
      }
    }
    // The token just sampled needs a position of its own before the next one.
    if (cache.length() >= context) {
      res.finish = FinishReason::Length;
      break;
    }
    if (int(res.tokens.size()) >= opt.max_tokens) {
      res.finish = FinishReason::Length;
      break;
    }
    const DecodeItem item{&cache, id};
    logits = model.decode_step({&item, 1});
    if (first_non_finite(logits) < logits.size())
      fail("non-finite logits (NaN/Inf) at decode step {} (position {})", res.tokens.size(), cache.length() - 1);
  }
  emit(stops.flush());
  return res;
}

}  // namespace vlm
