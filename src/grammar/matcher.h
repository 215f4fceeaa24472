// The bytes of a JSON text that matches a compiled schema (grammar/schema.h), checked one byte at
// a time: a pushdown automaton whose state is a small set of stacks, one per way the bytes so far
// can still be read (anyOf branches, optional properties). What it accepts is
// docs/structured-output.md's "What is generated": JSON with bounded whitespace between two tokens
// (none, one space, or one or two newlines and at most kMaxIndent spaces or tabs, as llama.cpp's
// JSON Schema grammars), declared properties in order, valid UTF-8, strings without escapes of lone
// surrogates, numbers of bounded length.
#pragma once
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "grammar/schema.h"

namespace vlm::grammar {

inline constexpr int kMaxIndent = 20;  // spaces or tabs after a newline between two JSON tokens
inline constexpr int kMaxDepth = 32;   // nested objects and arrays
inline constexpr int kMaxDigits = 16;  // digits of an integer part or a fraction
inline constexpr int kMaxExponentDigits = 2;  // so that every number is a finite double
// Readings kept at once (anyOf branches that agree so far); more are dropped, which narrows what
// may be generated to what the first ones allow (docs/structured-output.md, "Limits").
inline constexpr int kMaxReadings = 16;

struct Frame {
  const Node* node = nullptr;
  // Object: next property; Array: items; String: code points; Literal and key name: bytes read.
  int64_t count = 0;
  // Object: the property whose key or value is read; Literal and key name: the first value (or
  // property) that the bytes so far begin.
  int32_t chosen = 0;
  uint8_t kind = 0;    // Node::Kind, or one of matcher.cpp's frame kinds for keys
  uint8_t phase = 0;
  uint8_t space = 0;   // the whitespace of the current gap (Stepper::space)
  uint8_t need = 0;    // String: UTF-8 continuation bytes or \u digits still to come
  uint8_t lo = 0, hi = 0;  // String: the range of the next UTF-8 continuation byte
  uint16_t hex = 0;    // String: the \u digits so far
  bool operator==(const Frame&) const = default;
};

class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const Schema> schema);

  // Takes a byte; false (and the state unchanged) when no reading of the bytes so far allows it.
  bool feed(uint8_t c);
  bool feed(std::string_view bytes);  // all or nothing
  // True when the bytes so far are a whole value (a number may still go on).
  bool complete() const;
  // True when the bytes so far are a whole value and no byte may follow.
  bool closed() const { return closed(state_); }

  // The state as a value, for the vocabulary walk (grammar/token_mask.h): states are cheap to copy
  // between buffers that keep their capacity.
  struct State {
    std::vector<Frame> frames;   // the stacks, one after another
    std::vector<uint32_t> ends;  // where each stack ends in `frames`
  };
  // next = this state after `c`; returns false when nothing survives.
  static bool step(const State& from, uint8_t c, State& next);
  static bool complete(const State& s);
  static bool closed(const State& s);
  // When every reading is inside a string's characters (no escape or character begun): the most
  // code points one of them may still take (-1: any number); else kNotInString. Plain text (no
  // quote, backslash or control byte; whole UTF-8 characters) of at most that many code points
  // is taken whole.
  static constexpr int64_t kNotInString = -2;
  static int64_t string_room(const State& s);
  const State& state() const { return state_; }

 private:
  std::shared_ptr<const Schema> schema_;
  State state_, next_;
};

}  // namespace vlm::grammar
