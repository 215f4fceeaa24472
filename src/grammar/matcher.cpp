#include "grammar/matcher.h"

#include <algorithm>

namespace vlm::grammar {

namespace {

using Kind = Node::Kind;
constexpr uint8_t kObject = uint8_t(Kind::Object), kArray = uint8_t(Kind::Array), kString = uint8_t(Kind::String),
                  kNumber = uint8_t(Kind::Number), kLiteral = uint8_t(Kind::Literal);
constexpr uint8_t kKey = 6;    // a key of an object without declared properties: a string, no limits
constexpr uint8_t kValue = 7;  // a value of `node` not begun yet (the root before the first byte)
constexpr uint8_t kName = 8;   // a key of an object with declared properties: one of their names

// Object phases: before '{', after '{', in a key, after a key, after ':', in or after a value, after ','.
enum : uint8_t { kOpen, kFirst, kInKey, kAfterKey, kColon, kAfterValue, kComma };
// Array phases use kOpen, kFirst (after '['), kAfterValue and kComma.
// String phases.
enum : uint8_t { kQuote, kChars, kEscape, kHex, kUtf8 };
// Number phases (RFC 8259 §6); kInt, kZero, kFrac and kExp end a number.
enum : uint8_t { kStart, kMinus, kInt, kZero, kDot, kFrac, kE, kESign, kExp };

bool is_space(uint8_t c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
int hex_value(uint8_t c) {
  if (is_digit(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
bool number_ends(uint8_t phase) { return phase == kInt || phase == kZero || phase == kFrac || phase == kExp; }

Frame frame_for(const Node* n) {
  Frame f;
  f.node = n;
  f.kind = uint8_t(n->kind);
  return f;
}

// Take: `c` taken; Close: taken, and the value is whole; Leave: the value is whole and `c` is the
// parent's; Reject: no reading takes `c`.
enum class Step { Take, Close, Leave, Reject };

// The texts a Literal or key-name frame chooses among: the literal's values, or the names of the
// properties from the frame's first candidate up to the next required one.
struct Texts {
  explicit Texts(const Frame& f) : f(f), keys(f.kind == kName) {
    last = keys ? int32_t(f.node->properties.size()) - 1 : int32_t(f.node->texts.size()) - 1;
    if (keys)
      for (int32_t i = f.chosen; i <= last; ++i)
        if (f.node->properties[size_t(i)].required) {
          last = i;
          break;
        }
  }
  const std::string& operator[](int32_t i) const {
    return keys ? f.node->properties[size_t(i)].key : f.node->texts[size_t(i)];
  }
  // True when text i begins with the bytes read so far (those of the first candidate).
  bool agrees(int32_t i, size_t pos) const {
    const std::string& t = (*this)[i];
    return t.size() >= pos && t.compare(0, pos, (*this)[f.chosen], 0, pos) == 0;
  }
  // Whether a candidate ends after `pos` bytes, and whether one goes on.
  std::pair<bool, bool> ends_and_goes_on(size_t pos) const {
    bool ends = false, on = false;
    for (int32_t i = f.chosen; i <= last; ++i)
      if (agrees(i, pos)) ((*this)[i].size() == pos ? ends : on) = true;
    return {ends, on};
  }
  const Frame& f;
  bool keys;
  int32_t last;
};

Step literal(Frame& f, uint8_t c) {
  const Texts texts(f);
  const size_t pos = size_t(f.count);
  for (int32_t i = f.chosen; i <= texts.last; ++i) {
    if (!texts.agrees(i, pos) || texts[i].size() == pos || uint8_t(texts[i][pos]) != c) continue;
    f.chosen = i;
    f.count = int64_t(pos + 1);
    const auto [ends, on] = texts.ends_and_goes_on(pos + 1);
    return ends && !on ? Step::Close : Step::Take;
  }
  return texts.ends_and_goes_on(pos).first ? Step::Leave : Step::Reject;  // a number value's end
}

Step number(Frame& f, uint8_t c) {
  const bool integer = f.node->integer;
  const auto to = [&](uint8_t phase, int64_t count) {
    f.phase = phase;
    f.count = count;
    return Step::Take;
  };
  switch (f.phase) {
    case kStart:
      if (c == '-') return to(kMinus, 0);
      [[fallthrough]];
    case kMinus:
      if (c == '0') return to(kZero, 0);
      if (is_digit(c)) return to(kInt, 1);
      return Step::Reject;
    case kInt:
      if (is_digit(c) && f.count < kMaxDigits) return to(kInt, f.count + 1);
      [[fallthrough]];
    case kZero:
      if (c == '.' && !integer) return to(kDot, 0);
      if ((c == 'e' || c == 'E') && !integer) return to(kE, 0);
      break;
    case kDot:
      return is_digit(c) ? to(kFrac, 1) : Step::Reject;
    case kFrac:
      if (is_digit(c) && f.count < kMaxDigits) return to(kFrac, f.count + 1);
      if (c == 'e' || c == 'E') return to(kE, 0);
      break;
    case kE:
      if (c == '+' || c == '-') return to(kESign, 0);
      [[fallthrough]];
    case kESign:
      return is_digit(c) ? to(kExp, 1) : Step::Reject;
    case kExp:
      if (is_digit(c) && f.count < kMaxExponentDigits) return to(kExp, f.count + 1);
      break;
  }
  return number_ends(f.phase) ? Step::Leave : Step::Reject;
}

// A string's bytes; Close at the closing quote.
Step string(Frame& f, uint8_t c) {
  const int64_t min = f.node ? f.node->min_count : 0, max = f.node ? f.node->max_count : -1;
  const bool room = max < 0 || f.count < max;
  const auto start_char = [&](uint8_t phase) {
    if (!room) return Step::Reject;
    ++f.count;
    f.phase = phase;
    return Step::Take;
  };
  const auto utf8 = [&](uint8_t need, uint8_t lo, uint8_t hi) {
    f.need = need, f.lo = lo, f.hi = hi;
    return start_char(kUtf8);
  };
  switch (f.phase) {
    case kQuote:
      if (c != '"') return Step::Reject;
      f.phase = kChars;
      return Step::Take;
    case kChars:
      if (c == '"') return f.count >= min ? Step::Close : Step::Reject;
      if (c == '\\') return start_char(kEscape);
      if (c < 0x20) return Step::Reject;  // control characters must be escaped
      if (c < 0x80) return start_char(kChars);
      // A UTF-8 lead byte and the range of the byte after it (no overlongs, surrogates, > U+10FFFF).
      if (c >= 0xC2 && c <= 0xDF) return utf8(1, 0x80, 0xBF);
      if (c == 0xE0) return utf8(2, 0xA0, 0xBF);
      if (c == 0xED) return utf8(2, 0x80, 0x9F);
      if (c >= 0xE1 && c <= 0xEF) return utf8(2, 0x80, 0xBF);
      if (c == 0xF0) return utf8(3, 0x90, 0xBF);
      if (c >= 0xF1 && c <= 0xF3) return utf8(3, 0x80, 0xBF);
      if (c == 0xF4) return utf8(3, 0x80, 0x8F);
      return Step::Reject;
    case kEscape:
      if (c == 'u') {
        f.phase = kHex, f.need = 4, f.hex = 0;
        return Step::Take;
      }
      if (c != '"' && c != '\\' && c != '/' && c != 'b' && c != 'f' && c != 'n' && c != 'r' && c != 't')
        return Step::Reject;
      f.phase = kChars;
      return Step::Take;
    case kHex: {
      const int v = hex_value(c);
      if (v < 0) return Step::Reject;
      f.hex = uint16_t(f.hex << 4 | v);
      // \uD800-\uDFFF: a surrogate half, which a pair of escapes would need; one stands for nothing.
      if (--f.need == 2 && (f.hex & 0xF8) == 0xD8) return Step::Reject;
      if (f.need == 0) f.phase = kChars;
      return Step::Take;
    }
    case kUtf8:
      if (c < f.lo || c > f.hi) return Step::Reject;
      f.lo = 0x80, f.hi = 0xBF;
      if (--f.need == 0) f.phase = kChars;
      return Step::Take;
  }
  return Step::Reject;
}

// The readings of one stack after a byte, appended to `out` (stacks equal to one there are dropped).
class Stepper {
 public:
  explicit Stepper(Matcher::State& out) : out_(out) {}

  void advance(std::vector<Frame>& s, uint8_t c) {
    while (!s.empty()) {
      Frame& f = s.back();
      switch (f.kind) {
        case kValue: {
          const Node* n = f.node;
          s.pop_back();
          return begin(s, n, c, 0);
        }
        case kLiteral:
        case kName:
          switch (literal(f, c)) {
            case Step::Take: return emit(s);
            case Step::Close: {
              const int32_t chosen = f.chosen;
              const bool name = f.kind == kName;
              finish(s);
              if (name) s.back().chosen = chosen;  // the object reads that property's value next
              return emit(s);
            }
            case Step::Leave: finish(s); continue;
            case Step::Reject: return;
          }
          return;
        case kNumber:
          switch (number(f, c)) {
            case Step::Take: return emit(s);
            case Step::Reject: return;
            case Step::Leave: finish(s); continue;  // `c` goes to the parent
            case Step::Close: break;
          }
          return;
        case kString:
        case kKey:
          switch (string(f, c)) {
            case Step::Take: return emit(s);
            case Step::Close: finish(s); return emit(s);
            case Step::Leave:
            case Step::Reject: return;
          }
          return;
        case kArray: return array(s, c);
        case kObject: return object(s, c);
      }
      return;
    }
  }

 private:
  void emit(const std::vector<Frame>& s) {
    uint32_t begin = 0;
    for (uint32_t end : out_.ends) {  // the same stack read two ways is one reading
      if (end - begin == s.size() && std::equal(s.begin(), s.end(), out_.frames.begin() + begin)) return;
      begin = end;
    }
    if (out_.ends.size() >= size_t(kMaxReadings)) return;
    out_.frames.insert(out_.frames.end(), s.begin(), s.end());
    out_.ends.push_back(uint32_t(out_.frames.size()));
  }

  // A value of `n` begins with `c` (one reading per option of a choice).
  void begin(std::vector<Frame>& s, const Node* n, uint8_t c, int hops) {
    if (n->kind == Kind::Choice) {
      if (hops > kMaxDepth) return;  // a $ref cycle through choices only
      for (const Node* o : n->options) {
        std::vector<Frame> alt = s;
        begin(alt, o, c, hops + 1);
      }
      return;
    }
    if (s.size() > size_t(kMaxDepth)) return;
    s.push_back(frame_for(n));
    advance(s, c);
  }

  // Pops a finished value and moves its container past it.
  static void finish(std::vector<Frame>& s) {
    s.pop_back();
    if (s.empty()) return;
    Frame& p = s.back();
    p.space = 0;
    if (p.kind == kArray) {
      ++p.count;
      p.phase = kAfterValue;
    } else if (p.phase == kInKey) {
      p.phase = kAfterKey;
    } else {
      p.phase = kAfterValue;
      p.count = p.node->properties.empty() ? p.count + 1 : p.chosen + 1;
    }
  }

  // Whitespace in a gap: one space, or one or two newlines and at most kMaxIndent spaces or tabs
  // (f.space: 0 none yet, 1 a space, 2 and 3 one and two newlines, 3 + n those and n more). True
  // when `c` was whitespace (taken or not).
  bool space(std::vector<Frame>& s, uint8_t c) {
    if (!is_space(c)) return false;
    Frame& f = s.back();
    if (f.space == 0 && (c == ' ' || c == '\n')) f.space = c == ' ' ? 1 : 2;
    else if (f.space == 2 && c == '\n') f.space = 3;
    else if (f.space >= 2 && f.space < 3 + kMaxIndent && (c == ' ' || c == '\t')) f.space = uint8_t(std::max(f.space, uint8_t(3)) + 1);
    else return true;
    emit(s);
    return true;
  }

  void array(std::vector<Frame>& s, uint8_t c) {
    Frame& f = s.back();
    const Node* n = f.node;
    if (f.phase == kOpen) {
      if (c != '[') return;
      f.phase = kFirst;
      return emit(s);
    }
    if (space(s, c)) return;
    const bool more = n->items && (n->max_count < 0 || f.count < n->max_count);
    if (f.phase == kAfterValue) {
      if (c == ',' && more) {
        f.phase = kComma, f.space = 0;
        return emit(s);
      }
    } else if (more && c != ']') {
      f.space = 0;
      return begin(s, n->items, c, 0);
    }
    if (c == ']' && f.phase != kComma && f.count >= n->min_count) {
      finish(s);
      emit(s);
    }
  }

  void object(std::vector<Frame>& s, uint8_t c) {
    Frame& f = s.back();
    const Node* n = f.node;
    const auto& props = n->properties;
    if (f.phase == kOpen) {
      if (c != '{') return;
      f.phase = kFirst;
      return emit(s);
    }
    if (space(s, c)) return;
    f.space = 0;
    switch (f.phase) {
      case kFirst:
      case kComma:
        if (c == '"') {
          if (props.empty() && !n->extra) return;  // no key may come
          f.phase = kInKey;
          // Any string, or one of the names from the next property up to the next required one.
          Frame key;
          key.kind = props.empty() ? kKey : kName;
          if (!props.empty()) key.node = n, key.chosen = int32_t(f.count);
          s.push_back(key);
          return advance(s, c);
        }
        if (c == '}' && f.phase == kFirst) return close(s);
        return;
      case kAfterKey:
        if (c != ':') return;
        f.phase = kColon;
        return emit(s);
      case kColon:
        return begin(s, props.empty() ? n->extra : props[size_t(f.chosen)].value, c, 0);
      case kAfterValue:
        if (c == ',' && (props.empty() || size_t(f.count) < props.size())) {
          f.phase = kComma;
          return emit(s);
        }
        if (c == '}') return close(s);
        return;
    }
  }

  // '}' ends an object once no required property is left.
  void close(std::vector<Frame>& s) {
    const Frame& f = s.back();
    const auto& props = f.node->properties;
    for (size_t i = size_t(f.count); i < props.size(); ++i)
      if (props[i].required) return;
    finish(s);
    emit(s);
  }

  Matcher::State& out_;
};

}  // namespace

Matcher::Matcher(std::shared_ptr<const Schema> schema) : schema_(std::move(schema)) {
  Frame root;
  root.kind = kValue;
  root.node = schema_->root();
  state_.frames.push_back(root);
  state_.ends.push_back(1);
}

bool Matcher::step(const State& from, uint8_t c, State& next) {
  next.frames.clear();
  next.ends.clear();
  thread_local std::vector<Frame> s;
  Stepper stepper(next);
  uint32_t begin = 0;
  for (uint32_t end : from.ends) {
    s.assign(from.frames.begin() + begin, from.frames.begin() + end);
    stepper.advance(s, c);
    begin = end;
  }
  return !next.ends.empty();
}

bool Matcher::complete(const State& st) {
  uint32_t begin = 0;
  for (uint32_t end : st.ends) {
    if (end == begin) return true;
    // A number, or a literal such as 1 of [1, 12], is whole at the top while it may still go on.
    const Frame& f = st.frames[begin];
    if (end - begin == 1 && f.kind == kNumber && number_ends(f.phase)) return true;
    if (end - begin == 1 && f.kind == kLiteral && Texts(f).ends_and_goes_on(size_t(f.count)).first) return true;
    begin = end;
  }
  return false;
}

bool Matcher::closed(const State& st) {
  if (!complete(st)) return false;
  State next;
  for (int c = 0; c < 256; ++c)
    if (step(st, uint8_t(c), next)) return false;
  return true;
}

int64_t Matcher::string_room(const State& st) {
  // Every reading inside a string's characters: a plain token is taken by one of them when it fits
  // the roomiest.
  int64_t room = 0;
  uint32_t begin = 0;
  for (uint32_t end : st.ends) {
    if (end == begin) return kNotInString;
    const Frame& f = st.frames[end - 1];
    if ((f.kind != kString && f.kind != kKey) || f.phase != kChars) return kNotInString;
    if (!f.node || f.node->max_count < 0) room = -1;
    else if (room >= 0) room = std::max(room, f.node->max_count - f.count);
    begin = end;
  }
  return st.ends.empty() ? kNotInString : room;
}

bool Matcher::feed(uint8_t c) {
  if (!step(state_, c, next_)) return false;
  std::swap(state_, next_);
  return true;
}

bool Matcher::feed(std::string_view bytes) {
  State keep = state_;
  for (char c : bytes)
    if (!feed(uint8_t(c))) {
      state_ = std::move(keep);
      return false;
    }
  return true;
}

bool Matcher::complete() const { return complete(state_); }

}  // namespace vlm::grammar
