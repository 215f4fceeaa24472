// The request parser's bounds (server/protocol.h), on inputs fuzz_request found or that sit on a
// bound: what passes is within it, what does not is a 400 naming the field.
#include <gtest/gtest.h>

#include <string>

#include "grammar/matcher.h"
#include "server/protocol.h"
#include "server/responses.h"
#include "server/tools.h"

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

// Outputs the model cannot give are refused naming the field; their text-only settings and a
// prediction (only a speed-up) are taken.
TEST(Protocol, OutputsThisModelCannotGiveAreRefused) {
  const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
  const std::pair<std::string, const char*> refused[] = {
      {R"({"modalities":["text","audio"],)" + msgs + "}", "modalities"},
      {R"({"modalities":"text",)" + msgs + "}", "modalities"},
      {R"({"audio":{"voice":"alloy","format":"wav"},)" + msgs + "}", "audio"},
      {R"({"web_search_options":{},)" + msgs + "}", "web_search_options"},
      {R"({"reasoning_effort":"low",)" + msgs + "}", "reasoning_effort"},
  };
  for (const auto& [body, param] : refused) {
    const ApiError e = refusal(body, Endpoint::Chat);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param, param) << body << "\n" << e.message;
  }
  for (const std::string extra : {R"("modalities":["text"])", R"("reasoning_effort":"none")", R"("audio":null)",
                                  R"("prediction":{"type":"content","content":"hi there"})"})
    EXPECT_NO_THROW(parse_request(parse_body("{" + extra + "," + msgs + "}"), Endpoint::Chat, {})) << extra;
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

ApiRequest chat_with_tools(const std::string& extra) {
  return parse_request(parse_body(R"({"messages":[{"role":"user","content":"hi"}],"tools":[
      {"type":"function","function":{"name":"get_weather","description":"Weather now","parameters":
        {"type":"object","properties":{"city":{"$ref":"#/$defs/city"}},"required":["city"],
         "$defs":{"city":{"type":"string","maxLength":8}}}}},
      {"type":"function","function":{"name":"now"}}])" + extra + "}"),
                       Endpoint::Chat, {});
}

bool accepts(const ApiRequest& r, const std::string& answer) {
  grammar::Matcher m(r.response_schema);
  return m.feed(answer) && m.complete();
}

// The answer's schema: calls of the offered functions with their arguments (a $ref inside a
// function's parameters still finds its $defs), or a response where tool_choice is auto.
TEST(Tools, TheAnswerIsCallsOrAResponse) {
  const ApiRequest r = chat_with_tools("");
  ASSERT_TRUE(r.tool_answer);
  EXPECT_TRUE(accepts(r, R"({"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]})"));
  EXPECT_TRUE(accepts(r, R"({"tool_calls":[{"name":"now","arguments":{}},{"name":"now","arguments":{}}]})"));
  EXPECT_TRUE(accepts(r, R"({"response":"It is sunny."})"));
  EXPECT_FALSE(accepts(r, R"({"tool_calls":[{"name":"other","arguments":{}}]})"));
  EXPECT_FALSE(accepts(r, R"({"tool_calls":[{"name":"get_weather","arguments":{"city":"Parisienne"}}]})"));
  EXPECT_FALSE(accepts(r, R"({"tool_calls":[{"name":"now","arguments":{"x":1}}]})"));  // no parameters
  EXPECT_FALSE(accepts(r, R"({"tool_calls":[]})"));
  EXPECT_FALSE(accepts(r, R"(It is sunny.)"));

  const ApiRequest req = chat_with_tools(R"(,"tool_choice":"required","parallel_tool_calls":false)");
  EXPECT_FALSE(accepts(req, R"({"response":"It is sunny."})"));
  EXPECT_TRUE(accepts(req, R"({"tool_calls":[{"name":"now","arguments":{}}]})"));
  EXPECT_FALSE(accepts(req, R"({"tool_calls":[{"name":"now","arguments":{}},{"name":"now","arguments":{}}]})"));
  const ApiRequest named = chat_with_tools(R"(,"tool_choice":{"type":"function","function":{"name":"now"}})");
  EXPECT_TRUE(accepts(named, R"({"tool_calls":[{"name":"now","arguments":{}}]})"));
  EXPECT_FALSE(accepts(named, R"({"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]})"));
  // tool_choice none: the tools are not used.
  const ApiRequest none = chat_with_tools(R"(,"tool_choice":"none")");
  EXPECT_FALSE(none.tool_answer);
  EXPECT_EQ(none.response_schema, nullptr);
  // The functions and the answer's form go into a system turn ahead of the user's.
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_NE(r.messages[0].content.at(0).text.find(R"({"name":"get_weather","description":"Weather now")"),
            std::string::npos);
}

TEST(Tools, AnswersReadAsCallsOrContent) {
  ChoiceOut c;
  c.text = R"({"tool_calls":[{"name":"f","arguments":{"b":[1,2],"a":"x"}},{"name":"g","arguments":{}}]})";
  c.finish = "stop";
  read_tool_answer(c);
  ASSERT_EQ(c.tool_calls.size(), 2u);
  EXPECT_EQ(c.tool_calls[0].name, "f");
  EXPECT_EQ(c.tool_calls[0].arguments, R"({"b":[1,2],"a":"x"})");  // the order as generated
  EXPECT_EQ(c.tool_calls[0].id.size(), 29u);
  EXPECT_EQ(c.tool_calls[0].id.rfind("call_", 0), 0u);
  EXPECT_NE(c.tool_calls[0].id, c.tool_calls[1].id);
  EXPECT_EQ(c.text, "");
  EXPECT_EQ(c.finish, "tool_calls");

  ChoiceOut r;
  r.text = R"({"response":"Hello \"you\""})";
  r.finish = "stop";
  read_tool_answer(r);
  EXPECT_EQ(r.text, R"(Hello "you")");
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.finish, "stop");

  // max_tokens ended it mid-JSON: what it says so far (as OpenAI's cut calls), never the JSON.
  ChoiceOut cut;
  cut.text = R"({"tool_calls":[{"name":"f","arguments":{"a":[1,)";
  cut.finish = "length";
  read_tool_answer(cut);
  ASSERT_EQ(cut.tool_calls.size(), 1u);
  EXPECT_EQ(cut.tool_calls[0].name, "f");
  EXPECT_EQ(cut.tool_calls[0].arguments, R"({"a":[1,)");
  EXPECT_EQ(cut.text, "");
  EXPECT_EQ(cut.finish, "length");
  ChoiceOut unnamed;
  unnamed.text = R"({"tool_calls":[{"name":"f)";
  read_tool_answer(unnamed);
  EXPECT_TRUE(unnamed.tool_calls.empty());
  EXPECT_EQ(unnamed.text, "");
  ChoiceOut said;
  said.text = R"({"response":"Hel\u00)";
  said.finish = "stop";
  read_tool_answer(said);
  EXPECT_EQ(said.text, "Hel");
  EXPECT_EQ(said.finish, "stop");
}

// What a stream of the answer sends, fed in pieces of every size: the calls' first pieces carry
// their ids and names, their arguments' pieces add up to the JSON text as written (spaces
// included), the content is the decoded response and never half an escape; the result equals
// read_tool_answer's reading of the whole.
struct Streamed {
  std::string content;
  std::vector<ToolCall> calls;
  std::vector<std::string> contents;  // the content after each feed
  bool whole = false;
};
Streamed stream_in_pieces(const std::string& text, size_t piece) {
  ToolAnswerReader r;
  Streamed s;
  for (size_t p = 0; p < text.size(); p += piece) {
    const ToolAnswerReader::Delta d = r.feed(std::string_view(text).substr(p, piece));
    s.content += d.content;
    s.contents.push_back(s.content);
    for (const ToolCallDelta& c : d.calls) {
      if (!c.id.empty()) {
        EXPECT_EQ(c.index, s.calls.size());
        s.calls.push_back({c.id, c.name, {}});
      } else {
        EXPECT_LT(c.index, s.calls.size());
        EXPECT_FALSE(c.arguments.empty());
      }
      if (c.index < s.calls.size()) s.calls[c.index].arguments += c.arguments;
    }
  }
  s.whole = r.whole();
  return s;
}

TEST(Tools, StreamedAnswersAddUpToTheWholeOne) {
  const std::string calls_text =
      "{ \"tool_calls\" : [ {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par\\\"is\", \"days\": [1, 2]}},\n"
      "  {\"name\":\"now\",\"arguments\":{ }} ,{\"name\":\"n\",\"arguments\":12}] }";
  ChoiceOut whole;
  whole.text = calls_text;
  read_tool_answer(whole);
  ASSERT_EQ(whole.tool_calls.size(), 3u);
  EXPECT_EQ(whole.tool_calls[0].arguments, "{\"city\": \"Par\\\"is\", \"days\": [1, 2]}");  // as written
  EXPECT_EQ(whole.tool_calls[1].arguments, "{ }");
  EXPECT_EQ(whole.tool_calls[2].arguments, "12");
  for (size_t piece : {1, 2, 3, 7, 1000}) {
    const Streamed s = stream_in_pieces(calls_text, piece);
    EXPECT_TRUE(s.whole);
    EXPECT_EQ(s.content, "");
    ASSERT_EQ(s.calls.size(), 3u) << piece;
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_EQ(s.calls[k].name, whole.tool_calls[k].name);
      EXPECT_EQ(s.calls[k].arguments, whole.tool_calls[k].arguments) << piece;
      EXPECT_EQ(s.calls[k].id.rfind("call_", 0), 0u);
    }
  }
  // Cut before the end: the calls so far, their arguments as far as written, not whole.
  const Streamed cut = stream_in_pieces(calls_text.substr(0, calls_text.size() - 5), 1);
  EXPECT_FALSE(cut.whole);
  ASSERT_EQ(cut.calls.size(), 3u);
  EXPECT_EQ(cut.calls[2].arguments, "1");

  // fuzz_tool_answer: a call without a name (never written by the grammar) is not listed, and the
  // next call is call 0 (it was written at index 1 of an empty list).
  const Streamed unnamed = stream_in_pieces(R"({"tool_calls":[{"x":1,"arguments":{}},{"name":"now","arguments":{}}]})", 3);
  ASSERT_EQ(unnamed.calls.size(), 1u);
  EXPECT_EQ(unnamed.calls[0].name, "now");

  const std::string response = R"({"response": "caf\u00e9 \"x\"\n\ud83d\ude00 \\ end"})";
  ChoiceOut r;
  r.text = response;
  read_tool_answer(r);
  EXPECT_EQ(r.text, "caf\xC3\xA9 \"x\"\n\xF0\x9F\x98\x80 \\ end");
  for (size_t piece : {1, 2, 5}) {
    const Streamed s = stream_in_pieces(response, piece);
    EXPECT_TRUE(s.whole);
    EXPECT_TRUE(s.calls.empty());
    EXPECT_EQ(s.content, r.text);
    for (const std::string& so_far : s.contents) EXPECT_EQ(r.text.rfind(so_far, 0), 0u) << so_far;
  }
}

// Earlier calls and their results in a conversation read as the JSON the model writes: results in
// the user's turn, several in a row and the user's words after them one turn.
TEST(Tools, ConversationsCarryCallsAndResults) {
  const ApiRequest r = parse_request(parse_body(R"({"messages":[
      {"role":"user","content":"Weather?"},
      {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",
        "function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
      {"role":"tool","tool_call_id":"call_1","content":"20 C"},
      {"role":"tool","tool_call_id":"call_9","content":[{"type":"text","text":"sunny"}]},
      {"role":"user","content":"Thanks"}]})"),
                                     Endpoint::Chat, {});
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[1].role, "assistant");
  EXPECT_EQ(r.messages[1].content.at(0).text, R"({"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]})");
  EXPECT_EQ(r.messages[2].role, "user");
  ASSERT_EQ(r.messages[2].content.size(), 1u);
  EXPECT_EQ(r.messages[2].content[0].text,
            R"({"tool_response":{"name":"get_weather","tool_call_id":"call_1","content":"20 C"}})"
            "\n"
            R"({"tool_response":{"tool_call_id":"call_9","content":"sunny"}})"
            "\nThanks");
  EXPECT_FALSE(r.tool_answer);  // no tools offered this time
}

TEST(Tools, Refusals) {
  const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
  const std::string tool = R"({"type":"function","function":{"name":"f"}})";
  const std::pair<std::string, const char*> refused[] = {
      {R"({"tools":{"a":1},)" + msgs + "}", "tools"},
      {R"({"tools":[{"type":"retrieval"}],)" + msgs + "}", "tools[0].type"},
      {R"({"tools":[{"type":"function","function":{"name":"a b"}}],)" + msgs + "}", "tools[0].function.name"},
      {R"({"tools":[)" + tool + "," + tool + "]," + msgs + "}", "tools[1].function.name"},
      {R"({"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"string","pattern":"a"}}}],)" +
           msgs + "}",
       "tools[0].function.parameters"},
      {R"({"tools":[)" + tool + R"(],"tool_choice":"sometimes",)" + msgs + "}", "tool_choice"},
      {R"({"tools":[)" + tool + R"(],"tool_choice":{"type":"function","function":{"name":"g"}},)" + msgs + "}",
       "tool_choice.function.name"},
      {R"({"tool_choice":"auto",)" + msgs + "}", "tool_choice"},
      {R"({"tools":[)" + tool + R"(],"response_format":{"type":"json_object"},)" + msgs + "}", "response_format"},
      {R"({"functions":[],)" + msgs + "}", "functions"},
      {R"({"messages":[{"role":"assistant","tool_calls":[{"id":"x","function":{"name":"f","arguments":{}}}]}]})",
       "messages[0].tool_calls[0]"},
      {R"({"messages":[{"role":"tool","tool_call_id":"x","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]})",
       "messages[0].content[0]"},
      {R"({"messages":[{"role":"function","content":"x"}]})", "messages[0].role"},
  };
  for (const auto& [body, param] : refused) {
    const ApiError e = refusal(body, Endpoint::Chat);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param, param) << body << "\n" << e.message;
  }
  EXPECT_EQ(refusal(R"({"prompt":"a","tools":[)" + tool + "]}", Endpoint::Completion).param, "tools");

  // Two functions whose parameters each fit the schema bounds (4096 subschemas) and together do not.
  Json body = parse_body(R"({"messages":[{"role":"user","content":"hi"}],"tools":[]})");
  for (const char* name : {"a", "b"}) {
    Json props = Json::object();
    for (int i = 0; i < 2100; ++i) props["p" + std::to_string(i)] = {{"type", "integer"}};
    body["tools"].push_back({{"type", "function"},
                             {"function", {{"name", name}, {"parameters", {{"type", "object"}, {"properties", props}}}}}});
  }
  try {
    parse_request(body, Endpoint::Chat, {});
    ADD_FAILURE() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "tools") << e.message;
  }
}

// A Responses request is the chat request it means; its mistakes are named by its own fields.
TEST(Responses, ReadAsChatAndNamedByTheirOwnFields) {
  const ResponsesRequest r = parse_responses(parse_body(R"({"instructions":"Be brief.","input":[
      {"role":"user","content":[{"type":"input_text","text":"Weather?"}]},
      {"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{\"city\":\"Oslo\"}"},
      {"type":"function_call_output","call_id":"c1","output":"rain"}],"max_output_tokens":7})"),
                                             {});
  EXPECT_EQ(r.chat.max_tokens, 7);
  ASSERT_EQ(r.chat.messages.size(), 4u);
  EXPECT_EQ(r.chat.messages[0].role, "system");
  EXPECT_EQ(r.chat.messages[2].content.at(0).text, R"({"tool_calls":[{"name":"get_weather","arguments":{"city":"Oslo"}}]})");
  EXPECT_EQ(r.chat.messages[3].content.at(0).text, R"({"tool_response":{"name":"get_weather","tool_call_id":"c1","content":"rain"}})");
  EXPECT_EQ(r.origin, (std::vector<std::string>{"instructions", "input[0]", "input[1]", "input[2]"}));

  const std::pair<const char*, const char*> refused[] = {
      {R"({"input":[{"role":"user","content":"a"},{"role":"robot","content":"b"}]})", "input[1].role"},
      {R"({"instructions":"x","input":[{"role":"user"}]})", "input[0].content"},
      {R"({"input":"a","max_output_tokens":0})", "max_output_tokens"},
      {R"({"input":"a","text":{"format":{"type":"json_schema","name":"x","schema":{"type":"string","pattern":"a"}}}})",
       "text.format.schema"},
      {R"({"input":"a","tools":[{"type":"function","name":"a b"}]})", "tools[0].name"},
      {R"({"input":"a","tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"function","name":"g"}})",
       "tool_choice.name"},
      {R"({"input":"a","previous_response_id":"resp_1"})", "previous_response_id"},
      {R"({"input":[]})", "input"},
  };
  for (const auto& [body, param] : refused) {
    try {
      parse_responses(parse_body(body), {});
      ADD_FAILURE() << "accepted: " << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.param, param) << body << "\n" << e.message;
      EXPECT_EQ(e.message.find("messages"), std::string::npos) << e.message;
    }
  }
}

}  // namespace
}  // namespace vlm::server
