// Streaming detokenizer for generation: push ids one at a time and get back
// the text that became complete.
//
// Text is emitted as soon as it is valid UTF-8: a character whose bytes come
// from several `<0xNN>` byte-fallback tokens is held until its last byte
// arrives. Invalid UTF-8 is never emitted: a byte that cannot start or
// continue a valid character, or an unfinished character cut off by a
// non-byte token or by finish(), becomes U+FFFD (one per byte).
//
// The concatenated output equals Tokenizer::decode() whenever every run of
// byte tokens is valid UTF-8 (always the case for ids that encode() made).
// For malformed runs, decode() follows HF and turns the WHOLE run into U+FFFD
// per byte, which cannot be known before the run ends; streaming replaces only
// the offending bytes instead of holding text back.
#pragma once
#include <cstdint>
#include <string>

#include "text/tokenizer.h"

namespace vlm::text {

class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, DecodeOptions opt = {}) : tok_(&tok), opt_(opt) {}

  // Text completed by this id (possibly empty). Throws for an out-of-range id.
  std::string push(int32_t id);
  // Text still held back at the end of the stream (an unfinished character
  // becomes U+FFFD per byte). The decoder is then empty and can be reused.
  std::string finish();

 private:
  void drain(std::string& out, bool final);

  const Tokenizer* tok_;
  DecodeOptions opt_;
  std::string pending_;  // bytes from byte tokens not yet emitted
};

}  // namespace vlm::text
