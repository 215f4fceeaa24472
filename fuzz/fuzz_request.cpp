// libFuzzer target: an HTTP request body as `vlm serve` reads it. Input: one byte choosing the
// route (chat completions, completions, /tokenize, /detokenize, /v1/responses, /v1/messages), then
// the body. The parsers
// return a request within the bounds the server relies on, or throw ApiError with a 4xx status
// and a message; any other exception or a request out of bounds aborts (images at most 48 bytes,
// so that inputs reach the bound). The error, and a
// response whose text is the request's own bytes, dump as JSON that parses back.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "server/messages.h"
#include "server/protocol.h"
#include "server/responses.h"

namespace {

using namespace vlm::server;

constexpr ImagePolicy kImages{.allow_files = false, .max_images = 8, .max_image_bytes = 48};

void check(bool ok) {
  if (!ok) std::abort();
}

void check_dumps(const Json& j) { check(nlohmann::json::accept(dump(j))); }

void check_request(const ApiRequest& r) {
  check(r.n >= 1 && r.n <= 128);
  check(r.images.size() <= size_t(kImages.max_images));
  for (const ImageRef& im : r.images) check(im.bytes.size() <= kImages.max_image_bytes && im.path.empty());
  check(!r.max_tokens || *r.max_tokens >= 0);
  check(r.top_logprobs >= -1 && r.top_logprobs <= 20);
  check(r.logit_bias.size() <= 1024);
  for (const auto& [id, bias] : r.logit_bias) check(id >= 0 && bias >= -100 && bias <= 100);
  if (r.endpoint == Endpoint::Chat) {
    check(!r.messages.empty() && r.prompts.empty());
    if (r.tool_answer) check(r.response_schema && r.messages.front().role == "system");
    return;
  }
  check(!r.prompts.empty() && r.prompts.size() * size_t(r.n) <= 128);
  for (const Prompt& p : r.prompts)
    if (p.ids) {
      check(!p.ids->empty());
      for (int32_t id : *p.ids) check(id >= 0);
    }
  // Whatever the prompt's bytes, a response carrying them is JSON.
  ChoiceOut c;
  c.text = r.prompts[0].text;
  c.finish = "stop";
  check_dumps(completion_response({"cmpl-1", 0, "m", "fp"}, {c}, false, {}));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int route = data[0] % 6;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    const Json j = parse_body(body);
    switch (route) {
      case 0: check_request(parse_request(j, Endpoint::Chat, kImages)); break;
      case 1: check_request(parse_request(j, Endpoint::Completion, kImages)); break;
      case 2: {
        const TokenizeRequest t = parse_tokenize(j, kImages);
        check_request(t.request);
        if (t.request.endpoint == Endpoint::Completion) check(t.request.prompts.size() == 1 && !t.request.prompts[0].ids);
        break;
      }
      case 3:
        for (int32_t id : parse_detokenize(j).tokens) check(id >= 0);
        break;
      case 5: {
        const MessagesRequest m = parse_anthropic(j, kImages);
        check_request(m.chat);
        check(!m.origin.empty());
        for (const std::string& o : m.origin) check(o == "system" || o.rfind("messages[", 0) == 0);
        break;
      }
      default: {
        const ResponsesRequest r = parse_responses(j, kImages);
        check_request(r.chat);
        check(!r.origin.empty());
        for (const std::string& o : r.origin) check(o == "instructions" || o == "input" || o.rfind("input[", 0) == 0);
      }
    }
  } catch (const ApiError& e) {
    check(e.status >= 400 && e.status < 500 && !e.message.empty());
    check_dumps(error_json(e));
    check_dumps(anthropic_error_json(e));
  }
  return 0;
}
