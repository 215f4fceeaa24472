// The Gemma 3 tokenizer from a GGUF file's SentencePiece-style metadata
// (tokenizer.ggml.model = "llama": tokens, scores, token_type, special ids, add_bos,
// add_space_prefix, tokenizer.chat_template); docs/gguf.md describes the keys.
//
// SentencePiece's BPE merges, at every step, the adjacent pair whose concatenation is the
// vocabulary piece with the highest score. That is a BPE by merge rank once every way of
// writing a mergeable piece as two vocabulary pieces is ranked by the piece's score (ties
// by piece id, then by the two halves' ids, as HF's SentencePiece converter orders them),
// so the tokenizer is built by text::Tokenizer::from_pieces with those ranked merges:
// user-defined pieces (type 4) matched whole in any text, control pieces (type 3) only with
// parse_special, byte pieces (type 6) for byte fallback, spaces as U+2581 and no prefix space.
#pragma once
#include "io/gguf.h"
#include "text/tokenizer.h"

namespace vlm::text {

// Throws vlm::Error naming the file and key for missing, mismatched or unsupported keys.
Tokenizer tokenizer_from_gguf(const GgufHeader& h);

}  // namespace vlm::text
