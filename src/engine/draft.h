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

}  // namespace vlm::engine
