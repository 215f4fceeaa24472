// The request parser's bounds (server/protocol.h), on inputs fuzz_request found or that sit on a
// bound: what passes is within it, what does not is a 400 naming the field.
#include <gtest/gtest.h>

#include <string>

#include "server/protocol.h"

namespace vlm::server {
namespace {

ApiError refusal(const std::string& body, Endpoint ep, const ImagePolicy& images = {}) {
  try {
    parse_request(parse_body(body), ep, images);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << body;
  return {};
}

std::string image_body(size_t base64_chars) {
  return R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,)" +
         std::string(base64_chars, 'A') + R"("}}]}]})";
}

// Unpadded base64 holds 3 bytes per 4 characters plus up to 2: 67 characters are 50 bytes, which
// the estimate from the length alone (48) let past a 48-byte limit (found by fuzz_request).
TEST(Protocol, ImageBytesAreBoundedExactly) {
  const ImagePolicy p{.max_image_bytes = 48};
  EXPECT_EQ(parse_request(parse_body(image_body(64)), Endpoint::Chat, p).images.at(0).bytes.size(), 48u);
  for (size_t chars : {66, 67, 68}) {
    const ApiError e = refusal(image_body(chars), Endpoint::Chat, p);
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.code, "image_too_large") << chars;
    EXPECT_EQ(e.param, "messages[0].content[0].image_url") << chars;
  }
}

TEST(Protocol, PromptsAreStringsTokenIdsOrListsOfEither) {
  const ApiRequest one = parse_request(parse_body(R"({"prompt":"a b"})"), Endpoint::Completion, {});
  ASSERT_EQ(one.prompts.size(), 1u);
  EXPECT_EQ(one.prompts[0].text, "a b");
  EXPECT_FALSE(one.prompts[0].ids);
  const ApiRequest ids = parse_request(parse_body(R"({"prompt":[2,7,9],"n":3})"), Endpoint::Completion, {});
  ASSERT_EQ(ids.prompts.size(), 1u);
  EXPECT_EQ(*ids.prompts[0].ids, (std::vector<int32_t>{2, 7, 9}));
  EXPECT_EQ(ids.n, 3);
  const ApiRequest lists = parse_request(parse_body(R"({"prompt":[[2],[3,4]]})"), Endpoint::Completion, {});
  ASSERT_EQ(lists.prompts.size(), 2u);
  EXPECT_EQ(*lists.prompts[1].ids, (std::vector<int32_t>{3, 4}));
  const ApiRequest texts = parse_request(parse_body(R"({"prompt":["x","y","z"]})"), Endpoint::Completion, {});
  ASSERT_EQ(texts.prompts.size(), 3u);
  EXPECT_EQ(texts.prompts[2].text, "z");

  const std::pair<const char*, const char*> refused[] = {
      {R"({"prompt":[]})", "prompt"},
      {R"({"prompt":["a",[1]]})", "prompt[1]"},
      {R"({"prompt":[[1],"a"]})", "prompt[1]"},
      {R"({"prompt":[1,"a"]})", "prompt"},
      {R"({"prompt":[1,-2]})", "prompt"},
      {R"({"prompt":[1,2.5]})", "prompt"},
      {R"({"prompt":[1,4294967296]})", "prompt"},
      {R"({"prompt":[[]]})", "prompt[0]"},
      {R"({"prompt":{"a":1}})", "prompt"},
      {R"({"prompt":"a","n":0})", "n"},
      {R"({"prompt":"a","n":129})", "n"},
      {R"({"prompt":["a","b"],"n":65})", "n"},  // 130 choices
  };
  for (const auto& [body, param] : refused) {
    const ApiError e = refusal(body, Endpoint::Completion);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param, param) << body;
  }
  EXPECT_EQ(refusal(R"({"messages":[{"role":"user","content":"a"}],"n":200})", Endpoint::Chat).param, "n");
}

TEST(Protocol, TokenizeTakesOneTextPrompt) {
  for (const char* body : {R"({"prompt":["a","b"]})", R"({"prompt":[2,3]})"}) {
    try {
      parse_tokenize(parse_body(body), {});
      ADD_FAILURE() << "accepted: " << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.param, "prompt") << body;
    }
  }
  EXPECT_EQ(parse_tokenize(parse_body(R"({"prompt":"a"})"), {}).request.prompts.at(0).text, "a");
}

}  // namespace
}  // namespace vlm::server
