// Gemma 3 chat template and image placeholder expansion (docs/gemma3/prompt.md).
//
// The template is rendered into SEGMENTS instead of one string, so that text a
// user sent can never turn into control tokens: the template's own markers
// (<bos>, <start_of_turn>, <end_of_turn>) are Control segments carrying ids,
// and everything else (role names, newlines, message text) is Text. Adjacent
// Text segments are concatenated before tokenization, which reproduces HF's
// ids exactly — HF tokenizes the rendered string as a whole, so e.g. "user\n"
// followed by an image's "\n\n" merges into "user" + "\n\n\n" (ids 2364, 109).
//
// tokenize_prompt(parse_special = false): Text is tokenized literally (control
// tokens typed by a user stay text; see tokenizer.h). parse_special = true
// reproduces HF's processor byte for byte: every added token in the text is
// matched, and a "<start_of_image>" typed in text is an image slot, because HF
// replaces every occurrence of that string (text-only models, ImageTokens with
// boi < 0, have no image slots: the tokenizer alone gives the BOI id).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "text/tokenizer.h"

namespace vlm::text {

struct ChatPart {
  bool is_image = false;
  std::string text;  // text parts only
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" (others pass through verbatim)
  std::vector<ChatPart> content;  // a string content is one text part
};

// OpenAI-style messages: [{"role": ..., "content": "text" | [parts]}], parts
// {"type":"text","text":...}, {"type":"image"} or {"type":"image_url",...}
// (both image kinds are an image at that place); other part types are kept
// out, as the template ignores them. Errors name `where` and the message index.
std::vector<ChatMessage> parse_messages(const nlohmann::json& messages, const std::string& where);

struct Segment {
  enum class Kind { Control, Text, Image };
  Kind kind = Kind::Text;
  int32_t id = -1;   // Control: the token id
  std::string text;  // Text
};

// True when `chat_template` is the Gemma 3 template this file renders (the
// one in every Gemma 3 tokenizer_config.json).
bool is_gemma3_chat_template(std::string_view chat_template);

// How a rendered conversation ends: HF apply_chat_template's add_generation_prompt and
// continue_final_message (docs/gemma3/prompt.md, "Chat template").
enum class ChatEnd {
  GenerationPrompt,  // "<start_of_turn>model\n": the model answers in a turn of its own
  LastTurn,          // right after the last turn's "<end_of_turn>\n"
  ContinueFinal,     // inside the final assistant turn, after its (trimmed) text: the model goes on
};

// Renders the Gemma 3 template: <bos>, system prompt folded into the first user
// turn (not trimmed), roles alternating user/assistant (else the template's own
// error), assistant shown as "model", string contents and text parts trimmed of
// whitespace as Python's str.strip() does, images as Image segments, then the end
// `end` asks for. ContinueFinal needs a final assistant message whose last part is
// non-empty text.
std::vector<Segment> render_gemma3_chat(std::span<const ChatMessage> messages, const Tokenizer& tok,
                                        ChatEnd end = ChatEnd::GenerationPrompt);

// Where the last user message's turn begins (its <start_of_turn>) in the ids of `messages` rendered
// by render_gemma3_chat and tokenized without parse_special, the only way that id enters them;
// -1 without a user message. A chat front-end that edits or resends the last message parts there.
int64_t last_user_turn(std::span<const ChatMessage> messages, std::span<const int32_t> ids, const Tokenizer& tok);
// The same in a raw prompt that holds a chat as text (a client that renders the template itself and
// sends it to /v1/completions, its control tokens parsed): the last <start_of_turn> followed by the
// ids of "user"; -1 without one.
int64_t last_user_turn(std::span<const int32_t> ids, const Tokenizer& tok);

// The string HF's Jinja rendering gives (control tokens and images as their text).
std::string segments_to_string(std::span<const Segment> segments, const Tokenizer& tok);

// Layout of the tokens around each image (docs/gemma3/prompt.md#layouts): HF string expansion, or
// the Google reference's token splice ([108, BOI, soft×N, EOI, 108] with no
// newline merging).
enum class ImageLayout { HF, Google };

struct ImageTokens {
  int32_t boi = -1, eoi = -1, soft = -1;  // from config.json; -1 for a text-only model
  int tokens_per_image = 0;               // mm_tokens_per_image
  ImageLayout layout = ImageLayout::HF;
};

// Checks the ids against the tokenizer (<start_of_image>, <end_of_image>,
// <image_soft_token>) and the count for sanity; throws naming what differs.
void check_image_tokens(const ImageTokens& it, const Tokenizer& tok);

// What one image turns into: the FULL block "\n\n<boi><soft>×N<eoi>\n\n", or
// with n_crops > 0 the Pan & Scan text "Here is the original image " FULL
// " and here are some crops to help you see better " FULL (" " FULL)×(n-1).
std::vector<Segment> image_segments(int n_crops, const ImageTokens& it, const Tokenizer& tok);

// One run of soft tokens: image `image` (0-based, prompt order), `crop` 0 for
// the whole image and 1..n for Pan & Scan crops; ids[first, first + count).
struct ImageBlock {
  int image = 0, crop = 0;
  size_t first = 0, count = 0;
};

// Limits on one prompt, checked before tokenizing: far beyond any Gemma 3 context
// (128K tokens), low enough that the work and memory a hostile input asks for stay small.
inline constexpr size_t kMaxPromptBytes = size_t(4) << 20;    // text, over all segments
inline constexpr size_t kMaxPromptTokens = size_t(1) << 22;   // image tokens after expansion

struct PromptTokens {
  std::vector<int32_t> ids;
  std::vector<ImageBlock> blocks;
};

// Expands every Image segment (image k gets crops_per_image[k] crops; the
// span's size is the number of images given) and tokenizes. Throws when the
// number of image slots differs from the number of images, or when the soft
// prompt's text or image tokens exceed the limits above before any work, and when the
// tokens in the result are not exactly the expected blocks (a literal
// <image_soft_token> in text with parse_special), giving both numbers.
PromptTokens tokenize_prompt(std::span<const Segment> segments, const Tokenizer& tok, const ImageTokens& it,
                             std::span<const int> crops_per_image, bool parse_special = false);

// Python's str.strip(): removes leading/trailing characters for which
// str.isspace() is true (what Jinja's `trim` filter does in HF).
std::string_view python_strip(std::string_view s);

}  // namespace vlm::text
