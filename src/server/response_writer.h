// One generation response as it is written (`vlm serve`): the jobs of its choices, what the client
// asked for, and what went out, on each wire the server speaks: OpenAI's chat and completions
// (whole, or as server-sent chunks), the Responses API's and Anthropic's Messages API's whole
// bodies and typed event streams. Its write() is the body of cpp-httplib's chunked content
// provider, which polls the jobs and the client's socket (http_server.h).
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/model.h"
#include "server/messages.h"
#include "server/protocol.h"
#include "server/responses.h"
#include "server/scheduler.h"
#include "server/tools.h"

namespace httplib {
class DataSink;
}

namespace vlm::server {

class ResponseWriter {
 public:
  struct Choice {  // of jobs[i]
    std::string prompt;     // completions with echo
    int32_t first_id = -1;  // echo with logprobs: the prompt's first token, which has no logprob
    size_t scored = 0;      // echo with logprobs: the prompt tokens that get one (all but the first)
    JobOutput out;          // non-streamed: everything; streamed: what came since the last chunk
    bool done = false;      // its finish is in `out`
    bool echoed = false;    // streamed: its prompt went out (echo)
    bool sent = false;      // streamed: its finish went out
    ToolAnswerReader reader;  // with tools: the answer's JSON so far
  };
  JobGroup jobs;
  std::vector<Choice> choices;
  int n = 1;  // choices per prompt
  std::shared_ptr<const engine::Model> model;  // keeps the tokenizer alive
  ResponseMeta meta;
  Endpoint endpoint = Endpoint::Chat;
  bool stream = false, include_usage = false, echo = false, token_ids = false;
  int top_logprobs = -1;     // alternatives a token's logprobs carry (-1: no logprobs)
  int prompt_logprobs = -1;  // vLLM's prompt_logprobs: alternatives a prompt token's carry (-1: none)
  bool tool_answer = false;  // the text is tools.h's JSON, read as calls or content as it is written
  std::optional<Json> responses;  // POST /v1/responses: the request's settings the Response repeats
  bool anthropic = false;         // POST /v1/messages
  int prompt_tokens = 0;          // messages, streamed: message_start's input_tokens

  // Writes what there is to write now (the chunked content provider's body: a stream's events,
  // or the whole body once every choice finished); false once the client is gone, which cancels
  // the request.
  bool write(httplib::DataSink& sink);
  void cancel();  // every choice's job

 private:
  bool started_ = false;
  int events_ = 0;  // the Responses stream's events so far
  std::string said_;  // streamed (responses, messages): the text its deltas carried
  // Streamed responses with logprobs: the tokens of said_, and those whose text is still held back.
  std::vector<TokenOut> said_tokens_, held_;
  bool message_open_ = false;  // streamed (responses, messages): the text's item or block went out
  size_t calls_done_ = 0;      // streamed (responses, messages): the calls' items or blocks closed

  bool logprobs() const { return top_logprobs >= 0; }
  bool write_chat(httplib::DataSink& sink);  // chat or completions chunks
  bool write_body(httplib::DataSink& sink);  // not streamed: once every choice finished
  std::string piece(int32_t id) const;
  TokenOut token_out(const engine::TokenEvent& e, std::string text) const;
  // Choice i's prompt as echoed: its text and, with logprobs, its tokens (the first unscored).
  ChoiceOut echo_out(size_t i);
  // vLLM's prompt_logprobs of choice i: null for the first token, then each token's
  // {id: {logprob, rank, decoded_token}} with the prompt_logprobs most likely after it.
  Json prompt_logprobs_out(size_t i) const;
  // Choice i's output so far as the client sees it (its text, tokens and ids are then cleared).
  ChoiceOut take_out(size_t i, std::string finish = {});
  // Streamed with tools: choice i's new text read as the answer's JSON (ToolAnswerReader), the
  // response's text as content and pieces of the calls; nullopt while that adds nothing, unless
  // `finished` (then with the finish: tool_calls once the calls are whole).
  std::optional<ChoiceOut> tool_delta(size_t i, bool finished);
  // A finished choice's last output, read as tool calls or content where the request has tools.
  ChoiceOut finished_out(size_t i);
  // Not streamed: choice i whole, after its echoed prompt.
  ChoiceOut whole_out(size_t i);
  // Moves what each choice's job produced into its `out`; true once every choice has finished.
  bool poll(std::chrono::milliseconds timeout);
  // The first choice that ended in an error or was cancelled (the server stopping), if any.
  const Choice* failed() const;
  static std::string error_message(const Choice& c);
  // Writes `s`; false, the request cancelled, once the client is gone.
  bool send(httplib::DataSink& sink, const std::string& s);
  // A typed-event stream's poll (responses, messages): nullopt to go on (`done` once every choice
  // finished), else what the provider returns: false when the client is gone, true once a failed
  // choice's event (`error_event` of its error) went out and the stream ended.
  template <class ErrorEvent>
  std::optional<bool> poll_events(httplib::DataSink& sink, bool& done, ErrorEvent error_event);
  // The Responses API's answer, once its one choice has finished.
  ResponseOut response_out();
  // The Responses API's stream (responses.h): created and in_progress, the message's item and
  // part, text deltas, then each item done and completed (or incomplete); with tools, the answer's
  // text or its calls (each call's item added, its arguments in pieces, done once the next call
  // starts or the answer ends) as they are written. False once the client is gone.
  bool write_responses(httplib::DataSink& sink);
  // Anthropic's Message, once its one choice has finished (`text`: what the stream already sent).
  MessageOut message_out(const std::string* text = nullptr);
  // Anthropic's stream (messages.h): message_start, the text block, text deltas, each block's
  // stop, message_delta with the stop reason and usage, message_stop; with tools, the answer's
  // text or its tool_use blocks (each started with an empty input, its JSON in pieces, stopped
  // once the next one starts or the answer ends) as they are written. False once the client is
  // gone.
  bool write_anthropic(httplib::DataSink& sink);
  // Each prompt once (its first choice's prompt and image rows), every choice's tokens.
  UsageOut usage() const;
};

}  // namespace vlm::server
