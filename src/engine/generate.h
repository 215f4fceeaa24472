// A single-request generation loop (CLI): text prefill through the one prefill door,
// then decode steps with sampling until a stop id, a stop string, max tokens, the
// context limit or cancellation.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sampler.h"
#include "models/gemma3/decoder.h"

namespace vlm {

enum class FinishReason { Stop, Length, Cancelled };
std::string_view finish_name(FinishReason r);  // "stop" | "length" | "cancelled"

// Finds stop strings in streamed text. Text that could still be the start of a stop
// string is held back, so nothing past a stop string is ever emitted.
class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops);
  // Adds a piece; returns the text now safe to emit. After a match, stopped() is true
  // and the returned text ends right before the stop string.
  std::string feed(std::string_view piece);
  // Everything still held back (at the end of generation without a match).
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

struct GenerateOptions {
  int max_tokens = 256;
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;          // e.g. the config's eos ids
  std::vector<std::string> stop_strings;  // needs GenerateIO::piece
  int64_t context = 0;                    // 0 = the config's max_position_embeddings
};

struct GenerateIO {
  // Text of one generated token (a streaming detokenizer); null = no text output.
  std::function<std::string(int32_t)> piece;
  std::function<void(std::string_view)> on_text;  // streamed text
  std::function<void(int32_t)> on_token;          // every generated id, stop ids excluded
  const std::atomic<bool>* cancel = nullptr;      // checked before every step
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (a final stop id excluded)
  std::string text;             // streamed text, stop string excluded
  FinishReason finish = FinishReason::Length;
  int prompt_tokens = 0;
};

// Fails before any compute when the prompt does not fit in the context.
GenerateResult generate(const models::gemma3::Decoder& model, std::span<const int32_t> prompt, const GenerateOptions& opt,
                        const GenerateIO& io = {});
// The same from a prepared prefill (multimodal/host.h): `prompt` are its ids (for the
// sampler's penalties), `in` its rows and masks. `on_prefill` (optional) sees the cache
// and last-row logits right after the prefill (to save them).
GenerateResult generate(const models::gemma3::Decoder& model, const PrefillInput& in, std::span<const int32_t> prompt,
                        const GenerateOptions& opt, const GenerateIO& io = {},
                        const std::function<void(KvCache&, std::span<const float>)>& on_prefill = {});
// Resumes after a prefill: `cache` holds the prompt, `logits` are its last row's.
GenerateResult generate_from(const models::gemma3::Decoder& model, KvCache& cache, std::vector<float> logits,
                             std::span<const int32_t> prompt, const GenerateOptions& opt,
                             const GenerateIO& io = {});

}  // namespace vlm
