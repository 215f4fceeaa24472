#include "server/response_writer.h"

#include <httplib.h>
#include <fmt/format.h>

#include <utility>

namespace vlm::server {

using json = Json;

namespace {

constexpr auto kPoll = std::chrono::milliseconds(50);  // how often a response checks its client

}  // namespace

bool ResponseWriter::write(httplib::DataSink& sink) {
  if (!stream) return write_body(sink);
  if (responses) return write_responses(sink);
  if (anthropic) return write_anthropic(sink);
  return write_chat(sink);
}

bool ResponseWriter::write_chat(httplib::DataSink& sink) {
  const bool chat = endpoint == Endpoint::Chat;
  auto write = [&](const std::string& s) { return send(sink, s); };
  auto chunk = [&](const ChoiceOut& c) {
    return chat ? chat_delta_chunk(meta, c, logprobs(), include_usage)
                : completion_chunk(meta, c, logprobs(), include_usage);
  };
  // A finished choice's last chunks: what it still carries, then the finish on its own.
  auto last_chunks = [&](ChoiceOut fin) {
    std::string out;
    if (!fin.text.empty() || !fin.call_deltas.empty()) {
      ChoiceOut body = fin;
      body.finish.clear();
      out = sse(chunk(body));
      fin.text.clear(), fin.call_deltas.clear(), fin.tokens.clear(), fin.token_ids.reset();
    }
    return out + sse(chunk(fin));
  };
  if (!started_ && chat) {
    started_ = true;
    std::string head;
    for (size_t i = 0; i < choices.size(); ++i) head += sse(chat_role_chunk(meta, int(i), include_usage));
    return write(head);
  }
  const bool all = poll(kPoll);
  if (!sink.is_writable()) {
    cancel();
    return false;
  }
  std::string events;
  const Choice* bad = failed();
  for (size_t i = 0; i < choices.size(); ++i) {
    Choice& c = choices[i];
    // The prompt first (echo), once it is scored where logprobs are asked for.
    if (echo && !c.echoed) {
      if (c.out.prompt_tokens.size() < c.scored && !c.done) continue;
      c.echoed = true;
      events += sse(chunk(echo_out(i)));
    }
    const bool finishing = c.done && !c.sent && !bad;
    // Tokens without text yet (a character or a possible stop string held back) ride on
    // the next chunk, or on the finish.
    if (tool_answer) {
      if (std::optional<ChoiceOut> d = tool_delta(i, finishing)) events += finishing ? last_chunks(*d) : sse(chunk(*d));
    } else if (!c.out.text.empty() || (logprobs() && !c.out.tokens.empty())) {
      events += sse(chunk(take_out(i)));
    }
    if (finishing && !tool_answer) events += last_chunks(finished_out(i));
    c.sent = c.sent || finishing;
  }
  if (bad) {
    // openai-node raises an APIError for an event with an "error" key.
    cancel();
    events += sse(error_json({500, error_message(*bad), {}, "internal_error"})) + "data: [DONE]\n\n";
    if (!write(events)) return false;
    sink.done();
    return true;
  }
  if (all) {
    if (include_usage) events += sse(usage_chunk(meta, endpoint, usage()));
    events += "data: [DONE]\n\n";
  }
  if (!events.empty() && !write(events)) return false;
  if (all) sink.done();
  return true;
}

bool ResponseWriter::write_body(httplib::DataSink& sink) {
  const bool all = poll(kPoll);
  if (!sink.is_writable()) {
    cancel();
    return false;
  }
  const Choice* bad = failed();
  if (!all && !bad) return true;
  json body;
  if (bad) {
    cancel();
    const ApiError e{500, error_message(*bad), {}, "internal_error"};
    body = anthropic ? anthropic_error_json(e) : error_json(e);
  } else if (anthropic) {
    body = message_json(message_out());
  } else if (responses) {
    const ResponseOut r = response_out();
    body = response_json(r, *responses, r.incomplete ? "incomplete" : "completed");
  } else {
    std::vector<ChoiceOut> whole;
    std::vector<Json> prompt;  // read before whole_out, whose echo takes the prompt's tokens
    for (size_t i = 0; i < choices.size(); ++i) {
      if (prompt_logprobs >= 0) prompt.push_back(prompt_logprobs_out(i));
      whole.push_back(whole_out(i));
    }
    const bool chat = endpoint == Endpoint::Chat;
    body = chat ? chat_response(meta, whole, logprobs(), usage()) : completion_response(meta, whole, logprobs(), usage());
    // vLLM's places: a chat's once (its choices share the prompt), each completion choice's own.
    if (!prompt.empty() && chat) body["prompt_logprobs"] = prompt.front();
    for (size_t i = 0; i < prompt.size() && !chat; ++i) body["choices"][i]["prompt_logprobs"] = prompt[i];
  }
  if (!send(sink, dump(body))) return false;
  sink.done();
  return true;
}

std::string ResponseWriter::piece(int32_t id) const {
  const text::Tokenizer* tok = model->tokenizer();
  return tok ? tok->decode(std::span<const int32_t>(&id, 1)) : std::to_string(id);
}

TokenOut ResponseWriter::token_out(const engine::TokenEvent& e, std::string text) const {
  TokenOut t{e.id, std::move(text), piece(e.id), e.logprob, {}};
  for (auto& [id, lp] : e.top) t.top.emplace_back(piece(id), lp);
  return t;
}

Json ResponseWriter::prompt_logprobs_out(size_t i) const {
  auto entry = [&](int32_t id, float logprob, int rank) {
    return json{{"logprob", logprob}, {"rank", rank}, {"decoded_token", piece(id)}};
  };
  json out = json::array({nullptr});
  for (const engine::TokenEvent& e : choices[i].out.prompt_tokens) {
    json at = {{std::to_string(e.id), entry(e.id, e.logprob, e.rank)}};  // the prompt's token first
    for (size_t r = 0; r < std::min(e.top.size(), size_t(prompt_logprobs)); ++r)
      if (e.top[r].first != e.id) at[std::to_string(e.top[r].first)] = entry(e.top[r].first, e.top[r].second, int(r) + 1);
    out.push_back(std::move(at));
  }
  return out;
}

ChoiceOut ResponseWriter::echo_out(size_t i) {
  Choice& c = choices[i];
  ChoiceOut o;
  o.index = int(i);
  o.text = c.prompt;
  if (c.first_id >= 0) {
    // Its text is the echo's start, unless that is <bos> the echo leaves out (a text prompt).
    const std::string p = piece(c.first_id);
    TokenOut first{c.first_id, c.prompt.rfind(p, 0) == 0 ? p : "", p, 0.f, {}};
    first.unscored = true;
    o.tokens.push_back(std::move(first));
    for (const auto& e : c.out.prompt_tokens) {
      TokenOut t = token_out(e, piece(e.id));
      t.top.resize(std::min(t.top.size(), size_t(std::max(top_logprobs, 0))));  // prompt_logprobs may ask more
      o.tokens.push_back(std::move(t));
    }
  }
  c.out.prompt_tokens.clear();
  return o;
}

ChoiceOut ResponseWriter::take_out(size_t i, std::string finish) {
  JobOutput& o = choices[i].out;
  ChoiceOut c;
  c.index = int(i);
  c.text = std::move(o.text);
  c.finish = std::move(finish);
  if (!c.finish.empty()) c.stop_reason = o.stop_reason;
  if (logprobs())
    for (auto& e : o.tokens) c.tokens.push_back(token_out(e, e.text));
  if (token_ids && (!stream || !o.tokens.empty())) {  // vLLM's return_token_ids: the ids next to the text
    c.token_ids.emplace();
    for (const auto& e : o.tokens) c.token_ids->push_back(e.id);
  }
  o.text.clear();
  o.tokens.clear();
  return c;
}

std::optional<ChoiceOut> ResponseWriter::tool_delta(size_t i, bool finished) {
  Choice& c = choices[i];
  ToolAnswerReader::Delta d = c.reader.feed(std::exchange(c.out.text, {}));
  if (d.empty() && !finished) return std::nullopt;
  ChoiceOut o = take_out(i, finished ? finish_text(*c.out.finish) : std::string());
  o.text = std::move(d.content);
  o.call_deltas = std::move(d.calls);
  if (finished && c.reader.called()) o.finish = "tool_calls";
  return o;
}

ChoiceOut ResponseWriter::finished_out(size_t i) {
  ChoiceOut o = take_out(i, finish_text(*choices[i].out.finish));
  if (tool_answer) choices[i].reader.read(o);
  return o;
}

ChoiceOut ResponseWriter::whole_out(size_t i) {
  ChoiceOut o = finished_out(i);
  if (!echo) return o;
  ChoiceOut e = echo_out(i);
  o.text = e.text + o.text;
  o.tokens.insert(o.tokens.begin(), e.tokens.begin(), e.tokens.end());
  return o;
}

bool ResponseWriter::poll(std::chrono::milliseconds timeout) {
  wait_any(jobs, timeout);
  bool all = true;
  for (size_t i = 0; i < choices.size(); ++i) {
    Choice& c = choices[i];
    if (!c.done) c.done = jobs[i]->take(c.out, std::chrono::milliseconds(0));
    all = all && c.done;
  }
  return all;
}

void ResponseWriter::cancel() {
  for (auto& j : jobs) j->cancel();
}

const ResponseWriter::Choice* ResponseWriter::failed() const {
  for (const Choice& c : choices)
    if (c.done && (*c.out.finish == engine::FinishReason::Error || *c.out.finish == engine::FinishReason::Cancelled))
      return &c;
  return nullptr;
}

std::string ResponseWriter::error_message(const Choice& c) {
  return *c.out.finish == engine::FinishReason::Cancelled ? "the request was cancelled: the server is shutting down"
                                                          : c.out.error;
}

bool ResponseWriter::send(httplib::DataSink& sink, const std::string& s) {
  if (sink.write(s.data(), s.size())) return true;
  cancel();
  return false;
}

template <class ErrorEvent>
std::optional<bool> ResponseWriter::poll_events(httplib::DataSink& sink, bool& done, ErrorEvent error_event) {
  done = poll(kPoll);
  if (!sink.is_writable()) {
    cancel();
    return false;
  }
  const Choice* bad = failed();
  if (!bad) return std::nullopt;
  cancel();
  if (!send(sink, error_event(ApiError{500, error_message(*bad), {}, "internal_error"}))) return false;
  sink.done();
  return true;
}

ResponseOut ResponseWriter::response_out() {
  ChoiceOut c = finished_out(0);
  return {meta.id,           meta.created,           meta.model,          std::move(c.text),
          std::move(c.tokens), std::move(c.tool_calls), c.finish == "length", usage()};
}

bool ResponseWriter::write_responses(httplib::DataSink& sink) {
  auto write = [&](const std::string& s) { return send(sink, s); };
  const std::string item = message_id(meta.id);
  const Json part{{"type", "output_text"}, {"text", ""}, {"annotations", Json::array()}, {"logprobs", Json::array()}};
  auto open_message = [&] {
    message_open_ = true;
    std::string s = event({{"output_index", 0},
                           {"item", {{"type", "message"}, {"id", item}, {"status", "in_progress"},
                                     {"role", "assistant"}, {"content", Json::array()}}}},
                          "response.output_item.added", events_);
    return s + event({{"item_id", item}, {"output_index", 0}, {"content_index", 0}, {"part", part}},
                     "response.content_part.added", events_);
  };
  auto call_done = [&](size_t k, const Json& it) {
    calls_done_ = k + 1;
    return event({{"item_id", it["id"]}, {"output_index", k}, {"name", it["name"]}, {"arguments", it["arguments"]}},
                 "response.function_call_arguments.done", events_) +
           event({{"output_index", k}, {"item", it}}, "response.output_item.done", events_);
  };
  if (!started_) {
    started_ = true;
    ResponseOut r{meta.id, meta.created, meta.model, {}, {}, {}, false, {}};
    std::string head = event({{"response", response_json(r, *responses, "in_progress")}}, "response.created", events_);
    head += event({{"response", response_json(r, *responses, "in_progress")}}, "response.in_progress", events_);
    if (!tool_answer) head += open_message();
    return write(head);
  }
  bool done = false;
  if (auto end = poll_events(sink, done, [](const ApiError& e) { return sse(error_json(e)); })) return *end;
  std::string out;
  ChoiceOut d = tool_answer ? tool_delta(0, false).value_or(ChoiceOut{}) : take_out(0);
  const std::vector<ToolCall>& calls = choices[0].reader.calls();
  for (const ToolCallDelta& p : d.call_deltas) {
    if (!p.id.empty()) {
      if (p.index > 0) out += call_done(p.index - 1, function_call_item(meta.id, p.index - 1, calls[p.index - 1]));
      Json added = function_call_item(meta.id, p.index, {p.id, p.name, ""});
      added["status"] = "in_progress";
      out += event({{"output_index", p.index}, {"item", added}}, "response.output_item.added", events_);
    }
    if (!p.arguments.empty())
      out += event({{"item_id", call_item_id(meta.id, p.index)}, {"output_index", p.index}, {"delta", p.arguments}},
                   "response.function_call_arguments.delta", events_);
  }
  const std::string& text = d.text;
  // Tokens whose text is still held back (part of a character) go with the next delta.
  held_.insert(held_.end(), std::make_move_iterator(d.tokens.begin()), std::make_move_iterator(d.tokens.end()));
  if (!text.empty()) {
    if (!message_open_) out += open_message();
    said_ += text;
    out += event({{"item_id", item}, {"output_index", 0}, {"content_index", 0}, {"delta", text},
                  {"logprobs", logprob_list(held_)}},
                 "response.output_text.delta", events_);
    said_tokens_.insert(said_tokens_.end(), std::make_move_iterator(held_.begin()), std::make_move_iterator(held_.end()));
    held_.clear();
  }
  if (done) {
    ResponseOut r = response_out();
    r.text = said_;
    r.tokens = std::move(said_tokens_);
    r.tokens.insert(r.tokens.end(), held_.begin(), held_.end());
    const Json items = output_items(r);
    if (r.calls.empty() && !message_open_) out += open_message();
    for (size_t k = calls_done_; k < items.size(); ++k) {
      const Json& it = items[k];
      if (it["type"] == "function_call") {
        out += call_done(k, it);
        continue;
      }
      const Json& text_part = it["content"][0];
      out += event({{"item_id", item}, {"output_index", k}, {"content_index", 0}, {"text", text_part["text"]},
                    {"logprobs", text_part["logprobs"]}},
                   "response.output_text.done", events_);
      out += event({{"item_id", item}, {"output_index", k}, {"content_index", 0}, {"part", text_part}},
                   "response.content_part.done", events_);
      out += event({{"output_index", k}, {"item", it}}, "response.output_item.done", events_);
    }
    const std::string status = r.incomplete ? "incomplete" : "completed";
    out += event({{"response", response_json(r, *responses, status)}},
                 r.incomplete ? "response.incomplete" : "response.completed", events_);
  }
  if (!out.empty() && !write(out)) return false;
  if (done) sink.done();
  return true;
}

MessageOut ResponseWriter::message_out(const std::string* text) {
  ChoiceOut c = finished_out(0);
  const UsageOut u = usage();
  const auto* sequence = std::get_if<std::string>(&c.stop_reason);  // one of its stop_sequences
  const std::string stop = !c.tool_calls.empty() ? "tool_use"
                           : c.finish == "length" ? "max_tokens"
                           : sequence             ? "stop_sequence"
                                                  : "end_turn";
  return {meta.id,   meta.model,        text ? *text : std::move(c.text), std::move(c.tool_calls), stop,
          sequence ? *sequence : "", u.prompt_tokens, u.completion_tokens, u.cached_tokens};
}

bool ResponseWriter::write_anthropic(httplib::DataSink& sink) {
  auto write = [&](const std::string& s) { return send(sink, s); };
  auto ev = [](const char* type, Json e) {
    Json out{{"type", type}};
    for (auto& [key, value] : e.items()) out[key] = std::move(value);
    return fmt::format("event: {}\ndata: {}\n\n", type, dump(out));
  };
  auto text_start = [&] {
    message_open_ = true;
    return ev("content_block_start", {{"index", 0}, {"content_block", {{"type", "text"}, {"text", ""}}}});
  };
  auto stop_block = [&](size_t k) {
    calls_done_ = k + 1;
    return ev("content_block_stop", {{"index", k}});
  };
  if (!started_) {
    started_ = true;
    MessageOut m{meta.id, meta.model, {}, {}, {}, {}, prompt_tokens, 0, 0};
    std::string head = ev("message_start", {{"message", message_json(m, true)}});
    if (!tool_answer) head += text_start();
    return write(head);
  }
  bool done = false;
  if (auto end = poll_events(sink, done, [&](const ApiError& e) { return ev("error", anthropic_error_json(e)); }))
    return *end;
  std::string out;
  ChoiceOut d = tool_answer ? tool_delta(0, false).value_or(ChoiceOut{}) : take_out(0);
  for (const ToolCallDelta& p : d.call_deltas) {
    if (!p.id.empty()) {
      if (p.index > 0) out += stop_block(p.index - 1);
      out += ev("content_block_start", {{"index", p.index},
                                        {"content_block", {{"type", "tool_use"},
                                                           {"id", tool_use_id({p.id, p.name, ""})},
                                                           {"name", p.name},
                                                           {"input", Json::object()}}}});
    }
    if (!p.arguments.empty())
      out += ev("content_block_delta",
                {{"index", p.index}, {"delta", {{"type", "input_json_delta"}, {"partial_json", p.arguments}}}});
  }
  const std::string& text = d.text;
  if (!text.empty()) {
    if (!message_open_) out += text_start();
    said_ += text;
    out += ev("content_block_delta", {{"index", 0}, {"delta", {{"type", "text_delta"}, {"text", text}}}});
  }
  if (done) {
    const MessageOut m = message_out(&said_);
    if (m.calls.empty() && !message_open_) out += text_start();
    for (size_t k = calls_done_; k < std::max<size_t>(m.calls.size(), 1); ++k) out += stop_block(k);
    out += ev("message_delta", {{"delta", {{"stop_reason", m.stop_reason}, {"stop_sequence", stop_sequence_json(m)}}},
                                {"usage", message_json(m)["usage"]}});
    out += ev("message_stop", Json::object());
  }
  if (!out.empty() && !write(out)) return false;
  if (done) sink.done();
  return true;
}

UsageOut ResponseWriter::usage() const {
  UsageOut u;
  for (size_t i = 0; i < choices.size(); ++i) {
    const engine::Usage& e = choices[i].out.usage;
    if (i % size_t(n) == 0) {
      u.prompt_tokens += e.prompt_tokens;
      u.image_tokens += e.image_tokens;
      u.cached_tokens += e.cached_tokens;
    }
    u.completion_tokens += e.completion_tokens;
  }
  return u;
}

}  // namespace vlm::server
