#include "text/chat.h"

#include <algorithm>
#include <numeric>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace vlm::text {

namespace {

// tokenizer_config.json `chat_template` of the Gemma 3 releases, verbatim.
constexpr std::string_view kGemma3Template =
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n'}}\n"
    "{%- endif -%}\n";

// Code point of the valid UTF-8 sequence at s[i] of length len.
char32_t decode_at(std::string_view s, size_t i, size_t len) {
  const auto b = [&](size_t k) { return char32_t(static_cast<unsigned char>(s[i + k])); };
  switch (len) {
    case 1: return b(0);
    case 2: return (b(0) & 0x1F) << 6 | (b(1) & 0x3F);
    case 3: return (b(0) & 0x0F) << 12 | (b(1) & 0x3F) << 6 | (b(2) & 0x3F);
    default: return (b(0) & 0x07) << 18 | (b(1) & 0x3F) << 12 | (b(2) & 0x3F) << 6 | (b(3) & 0x3F);
  }
}

// Python's str.isspace() (Unicode White_Space minus a few, plus the
// information separators U+001C..U+001F).
bool python_isspace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

Segment control(int32_t id) { return {Segment::Kind::Control, id, {}}; }
Segment text_seg(std::string s) { return {Segment::Kind::Text, -1, std::move(s)}; }

int32_t required_id(const Tokenizer& tok, std::string_view name) {
  auto id = tok.token_id(name);
  if (!id) fail("tokenizer has no token {} (needed by the Gemma 3 chat template)", name);
  return *id;
}

}  // namespace

std::string_view python_strip(std::string_view s) {
  size_t i = 0, begin = s.size(), end = 0;
  while (i < s.size()) {
    size_t len = utf8_sequence_length(s, i);
    const bool space = len != 0 && python_isspace(decode_at(s, i, len));
    if (len == 0) len = 1;  // an invalid byte is not whitespace (encode refuses it later)
    if (!space) {
      if (begin == s.size()) begin = i;
      end = i + len;
    }
    i += len;
  }
  return begin == s.size() ? std::string_view() : s.substr(begin, end - begin);
}

std::vector<ChatMessage> parse_messages(const nlohmann::json& messages, const std::string& where) {
  if (!messages.is_array()) fail("{}: messages must be a JSON array", where);
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const nlohmann::json& m = messages[i];
    const std::string at = fmt::format("{}: messages[{}]", where, i);
    if (!m.is_object()) fail("{} must be an object", at);
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) fail("{}.role must be a string", at);
    ChatMessage msg{role->get<std::string>(), {}};
    auto content = m.find("content");
    if (content == m.end()) fail("{}.content is missing", at);
    if (content->is_string()) {
      msg.content.push_back({false, content->get<std::string>()});
    } else if (content->is_array()) {
      for (size_t k = 0; k < content->size(); ++k) {
        const nlohmann::json& p = (*content)[k];
        auto type = p.is_object() ? p.find("type") : p.end();
        if (!p.is_object() || type == p.end() || !type->is_string())
          fail("{}.content[{}] must be an object with a string \"type\"", at, k);
        const std::string& ty = type->get_ref<const std::string&>();
        if (ty == "image" || ty == "image_url") {
          msg.content.push_back({true, {}});
        } else if (ty == "text") {
          auto text = p.find("text");
          if (text == p.end() || !text->is_string()) fail("{}.content[{}].text must be a string", at, k);
          msg.content.push_back({false, text->get<std::string>()});
        }
      }
    } else {
      fail("{}.content must be a string or an array of parts (Invalid content type)", at);
    }
    out.push_back(std::move(msg));
  }
  return out;
}

bool is_gemma3_chat_template(std::string_view chat_template) { return chat_template == kGemma3Template; }

std::vector<Segment> render_gemma3_chat(std::span<const ChatMessage> messages, const Tokenizer& tok,
                                        ChatEnd end) {
  const int32_t bos = required_id(tok, tok.bos_token().empty() ? "<bos>" : tok.bos_token());
  const int32_t sot = required_id(tok, "<start_of_turn>"), eot = required_id(tok, "<end_of_turn>");
  if (messages.empty()) fail("chat template: no messages");

  std::vector<Segment> out{control(bos)};
  std::string first_user_prefix;
  if (messages[0].role == "system") {
    const auto& c = messages[0].content;
    if (c.empty() || c[0].is_image) fail("chat template: the system message's first content part must be text");
    first_user_prefix = c[0].text + "\n\n";
    messages = messages.subspan(1);
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if ((m.role == "user") != (i % 2 == 0))
      fail("chat template: Conversation roles must alternate user/assistant/user/assistant/... (message {} has role '{}')",
           i, m.role);
    out.push_back(control(sot));
    out.push_back(text_seg((m.role == "assistant" ? std::string("model") : m.role) + "\n" +
                           (i == 0 ? first_user_prefix : std::string())));
    for (const ChatPart& p : m.content) {
      if (p.is_image) {
        out.push_back({Segment::Kind::Image, -1, {}});
      } else {
        out.push_back(text_seg(std::string(python_strip(p.text))));
      }
    }
    if (end == ChatEnd::ContinueFinal && i + 1 == messages.size()) {
      // HF cuts the rendering right after the final message's last text, stripped.
      if (m.role != "assistant" || m.content.empty() || m.content.back().is_image ||
          python_strip(m.content.back().text).empty())
        fail("chat template: continue_final_message needs a final assistant message ending in text");
      return out;
    }
    out.push_back(control(eot));
    out.push_back(text_seg("\n"));
  }
  if (end == ChatEnd::ContinueFinal) fail("chat template: continue_final_message needs a final assistant message");
  if (end == ChatEnd::GenerationPrompt) {
    out.push_back(control(sot));
    out.push_back(text_seg("model\n"));
  }
  return out;
}

int64_t last_user_turn(std::span<const ChatMessage> messages, std::span<const int32_t> ids, const Tokenizer& tok) {
  const int32_t sot = required_id(tok, "<start_of_turn>");
  if (!messages.empty() && messages[0].role == "system") messages = messages.subspan(1);
  // Each message opens one turn, in order.
  int64_t turn = -1;
  for (size_t i = 0; i < messages.size(); ++i)
    if (messages[i].role == "user") turn = int64_t(i);
  for (size_t p = 0; turn >= 0 && p < ids.size(); ++p)
    if (ids[p] == sot && turn-- == 0) return int64_t(p);
  return -1;
}

int64_t last_user_turn(std::span<const int32_t> ids, const Tokenizer& tok) {
  const int32_t sot = required_id(tok, "<start_of_turn>");
  const std::vector<int32_t> user = tok.encode("user");
  for (size_t p = ids.size(); p-- > 0;)
    if (ids[p] == sot && ids.size() - p - 1 >= user.size() &&
        std::equal(user.begin(), user.end(), ids.begin() + std::ptrdiff_t(p + 1)))
      return int64_t(p);
  return -1;
}

std::string segments_to_string(std::span<const Segment> segments, const Tokenizer& tok) {
  std::string s;
  for (const Segment& seg : segments) {
    switch (seg.kind) {
      case Segment::Kind::Control: s += tok.token(seg.id); break;
      case Segment::Kind::Text: s += seg.text; break;
      case Segment::Kind::Image: s += "<start_of_image>"; break;
    }
  }
  return s;
}

void check_image_tokens(const ImageTokens& it, const Tokenizer& tok) {
  const std::pair<int32_t, const char*> expected[] = {
      {it.boi, "<start_of_image>"}, {it.eoi, "<end_of_image>"}, {it.soft, "<image_soft_token>"}};
  for (const auto& [id, name] : expected) {
    if (id < 0 || id >= tok.vocab_size())
      fail("image token id {} (for {}) is outside the tokenizer's {} ids", id, name, tok.vocab_size());
    if (tok.token(id) != name) fail("image token id {} is '{}' in the tokenizer, expected {}", id, tok.token(id), name);
  }
  if (it.tokens_per_image <= 0 || it.tokens_per_image > 65536)
    fail("mm_tokens_per_image {} is out of range (1..65536)", it.tokens_per_image);
}

std::vector<Segment> image_segments(int n_crops, const ImageTokens& it, const Tokenizer& tok) {
  if (n_crops < 0) fail("pan & scan crop count {} is negative", n_crops);
  std::vector<Segment> out;
  auto full = [&] {
    // HF inserts "\n\n" as text (it merges with neighbouring newlines); the
    // Google reference splices the "\n\n" token itself.
    auto newline2 = [&] {
      out.push_back(it.layout == ImageLayout::HF ? text_seg("\n\n") : control(required_id(tok, "\n\n")));
    };
    newline2();
    out.push_back(control(it.boi));
    for (int k = 0; k < it.tokens_per_image; ++k) out.push_back(control(it.soft));
    out.push_back(control(it.eoi));
    newline2();
  };
  if (n_crops == 0) {
    full();
    return out;
  }
  out.push_back(text_seg("Here is the original image "));
  full();
  out.push_back(text_seg(" and here are some crops to help you see better "));
  for (int c = 0; c < n_crops; ++c) {
    if (c > 0) out.push_back(text_seg(" "));
    full();
  }
  return out;
}

PromptTokens tokenize_prompt(std::span<const Segment> segments, const Tokenizer& tok, const ImageTokens& it,
                             std::span<const int> crops_per_image, bool parse_special) {
  // With parse_special, "<start_of_image>" in text is an image slot, as HF's
  // plain string replacement makes it (for models with images).
  std::vector<Segment> slots;
  const std::string boi_text = "<start_of_image>";
  for (const Segment& s : segments) {
    if (s.kind != Segment::Kind::Text || !parse_special || it.boi < 0) {
      slots.push_back(s);
      continue;
    }
    size_t pos = 0;
    for (size_t hit; (hit = s.text.find(boi_text, pos)) != std::string::npos; pos = hit + boi_text.size()) {
      slots.push_back(text_seg(s.text.substr(pos, hit - pos)));
      slots.push_back({Segment::Kind::Image, -1, {}});
    }
    slots.push_back(text_seg(s.text.substr(pos)));
  }

  size_t n_slots = 0;
  for (const Segment& s : slots) n_slots += s.kind == Segment::Kind::Image;
  if (n_slots != crops_per_image.size())
    fail("the prompt has {} image slots (<start_of_image>) but {} images were given", n_slots, crops_per_image.size());
  if (n_slots > 0) check_image_tokens(it, tok);
  size_t text_bytes = 0;
  for (const Segment& s : slots) text_bytes += s.text.size();
  if (text_bytes > kMaxPromptBytes)
    fail("the prompt's text of {} bytes exceeds the limit of {} bytes", text_bytes, kMaxPromptBytes);
  uint64_t image_tokens = 0;  // 64-bit: counts from options multiply
  for (int c : crops_per_image) image_tokens += uint64_t(c + 1) * uint64_t(std::max(it.tokens_per_image, 0));
  if (image_tokens > kMaxPromptTokens)
    fail("{} images ({} crops, {} tokens each) expand to {} image tokens, more than the limit of {}",
         crops_per_image.size(), std::accumulate(crops_per_image.begin(), crops_per_image.end(), int64_t(0)),
         it.tokens_per_image, image_tokens, kMaxPromptTokens);

  PromptTokens out;
  std::string text;  // adjacent Text segments, tokenized together as HF does
  auto flush = [&] {
    tok.encode_append(text, parse_special, out.ids);
    text.clear();
  };
  size_t image = 0;
  for (const Segment& s : slots) {
    if (s.kind == Segment::Kind::Image) {
      for (const Segment& e : image_segments(crops_per_image[image++], it, tok)) {
        if (e.kind == Segment::Kind::Text) {
          text += e.text;
        } else {
          flush();
          out.ids.push_back(e.id);
        }
      }
    } else if (s.kind == Segment::Kind::Text) {
      text += s.text;
    } else {
      flush();
      out.ids.push_back(s.id);
    }
  }
  flush();

  // Soft tokens must be exactly the expected blocks, in order.
  size_t expected = 0;
  for (int c : crops_per_image) expected += size_t(c + 1) * it.tokens_per_image;
  size_t found = 0;
  for (int32_t id : out.ids) found += it.soft >= 0 && id == it.soft;
  if (found != expected)
    fail("the prompt has {} image soft tokens but {} images need {} (is <image_soft_token> in the text?)", found,
         crops_per_image.size(), expected);
  image = 0;
  int crop = 0;
  for (size_t i = 0; i < out.ids.size(); ++i) {
    if (it.soft < 0 || out.ids[i] != it.soft) continue;
    size_t j = i;
    while (j < out.ids.size() && out.ids[j] == it.soft) ++j;
    if (j - i != size_t(it.tokens_per_image))
      fail("the prompt has a run of {} image soft tokens where {} were expected", j - i, it.tokens_per_image);
    out.blocks.push_back({int(image), crop, i, j - i});
    if (++crop > crops_per_image[image]) {
      crop = 0;
      ++image;
    }
    i = j - 1;
  }
  return out;
}

}  // namespace vlm::text
