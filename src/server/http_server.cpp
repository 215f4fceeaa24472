#include "server/http_server.h"

#include <httplib.h>
#include <fmt/format.h>

#include <cstdio>
#include <ctime>
#include <thread>

#include "core/error.h"
#include "io/json.h"
#include "server/chat_page.h"
#include "server/messages.h"
#include "server/responses.h"
#include "server/tools.h"

namespace vlm::server {

using json = Json;

namespace {

constexpr auto kPoll = std::chrono::milliseconds(50);  // how often a response checks its client

void send_json(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(dump(j), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e, bool anthropic = false) {
  send_json(res, e.status, anthropic ? anthropic_error_json(e) : error_json(e));
  if (e.status == 429) res.set_header("Retry-After", "1");
  // openai-node retries 408/409/429/5xx unless told not to; a client mistake never helps by retrying.
  if (e.status < 500 && e.status != 429) res.set_header("x-should-retry", "false");
}

// Constant-time comparison, so the key cannot be guessed byte by byte from response times.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char d = a.size() != b.size();
  for (size_t i = 0; i < a.size(); ++i) d |= uint8_t(a[i]) ^ uint8_t(b[i % (b.size() ? b.size() : 1)]);
  return d == 0;
}

}  // namespace

// One generation response being written: its jobs (one per choice), what the client asked for,
// what was sent.
struct HttpServer::Stream {
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
  bool stream = false, include_usage = false, logprobs = false, echo = false, token_ids = false;
  // The text is tools.h's JSON, read as calls or content: a chat stream sends them as they are
  // written; the Responses and Messages streams whole at the end.
  bool tool_answer = false;
  bool started = false;
  // POST /v1/responses: the request's settings the Response repeats, and its events so far.
  std::optional<Json> responses;
  int events = 0;
  std::string said;  // streamed (responses, messages): the text its deltas carried
  bool message_open = false;  // streamed (responses, messages): the text's item or block went out
  size_t calls_done = 0;      // streamed (responses, messages): the calls' items or blocks closed
  bool anthropic = false;  // POST /v1/messages
  int prompt_tokens = 0;   // messages, streamed: message_start's input_tokens

  std::string piece(int32_t id) const {
    const text::Tokenizer* tok = model->tokenizer();
    return tok ? tok->decode(std::span<const int32_t>(&id, 1)) : std::to_string(id);
  }
  TokenOut token_out(const engine::TokenEvent& e, std::string text) const {
    TokenOut t{e.id, std::move(text), piece(e.id), e.logprob, {}};
    for (auto& [id, lp] : e.top) t.top.emplace_back(piece(id), lp);
    return t;
  }
  // Choice i's prompt as echoed: its text and, with logprobs, its tokens (the first unscored).
  ChoiceOut echo_out(size_t i) {
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
      for (const auto& e : c.out.prompt_tokens) o.tokens.push_back(token_out(e, piece(e.id)));
    }
    c.out.prompt_tokens.clear();
    return o;
  }
  // Choice i's output so far as the client sees it (its text, tokens and ids are then cleared).
  ChoiceOut take_out(size_t i, std::string finish = {}) {
    JobOutput& o = choices[i].out;
    ChoiceOut c;
    c.index = int(i);
    c.text = std::move(o.text);
    c.finish = std::move(finish);
    if (!c.finish.empty()) c.stop_reason = o.stop_reason;
    if (logprobs)
      for (auto& e : o.tokens) c.tokens.push_back(token_out(e, e.text));
    if (token_ids && (!stream || !o.tokens.empty())) {  // vLLM's return_token_ids: the ids next to the text
      c.token_ids.emplace();
      for (const auto& e : o.tokens) c.token_ids->push_back(e.id);
    }
    o.text.clear();
    o.tokens.clear();
    return c;
  }
  // Streamed with tools: choice i's new text read as the answer's JSON (ToolAnswerReader), the
  // response's text as content and pieces of the calls; nullopt while that adds nothing, unless
  // `finished` (then with the finish: tool_calls once the calls are whole).
  std::optional<ChoiceOut> tool_delta(size_t i, bool finished) {
    Choice& c = choices[i];
    ToolAnswerReader::Delta d = c.reader.feed(std::exchange(c.out.text, {}));
    if (d.empty() && !finished) return std::nullopt;
    ChoiceOut o = take_out(i, finished ? finish_text(*c.out.finish) : std::string());
    o.text = std::move(d.content);
    o.call_deltas = std::move(d.calls);
    if (finished && c.reader.whole() && !c.reader.calls().empty()) o.finish = "tool_calls";
    return o;
  }
  // A finished choice's last output, read as tool calls or content where the request has tools.
  ChoiceOut finished_out(size_t i) {
    ChoiceOut o = take_out(i, finish_text(*choices[i].out.finish));
    if (tool_answer) choices[i].reader.read(o);
    return o;
  }
  // Not streamed: choice i whole, after its echoed prompt.
  ChoiceOut whole_out(size_t i) {
    ChoiceOut o = finished_out(i);
    if (!echo) return o;
    ChoiceOut e = echo_out(i);
    o.text = e.text + o.text;
    o.tokens.insert(o.tokens.begin(), e.tokens.begin(), e.tokens.end());
    return o;
  }
  // Moves what each choice's job produced into its `out`; true once every choice has finished.
  bool poll(std::chrono::milliseconds timeout) {
    wait_any(jobs, timeout);
    bool all = true;
    for (size_t i = 0; i < choices.size(); ++i) {
      Choice& c = choices[i];
      if (!c.done) c.done = jobs[i]->take(c.out, std::chrono::milliseconds(0));
      all = all && c.done;
    }
    return all;
  }
  void cancel() {
    for (auto& j : jobs) j->cancel();
  }
  // The first choice that ended in an error or was cancelled (the server stopping), if any.
  const Choice* failed() const {
    for (const Choice& c : choices)
      if (c.done && (*c.out.finish == engine::FinishReason::Error || *c.out.finish == engine::FinishReason::Cancelled))
        return &c;
    return nullptr;
  }
  static std::string error_message(const Choice& c) {
    return *c.out.finish == engine::FinishReason::Cancelled ? "the request was cancelled: the server is shutting down"
                                                            : c.out.error;
  }
  // Writes `s`; false, the request cancelled, once the client is gone.
  bool send(httplib::DataSink& sink, const std::string& s) {
    if (sink.write(s.data(), s.size())) return true;
    cancel();
    return false;
  }
  // A typed-event stream's poll (responses, messages): nullopt to go on (`done` once every choice
  // finished), else what the provider returns: false when the client is gone, true once a failed
  // choice's event (`error_event` of its error) went out and the stream ended.
  template <class ErrorEvent>
  std::optional<bool> poll_events(httplib::DataSink& sink, bool& done, ErrorEvent error_event) {
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
  // The Responses API's answer, once its one choice has finished.
  ResponseOut response_out() {
    ChoiceOut c = finished_out(0);
    return {meta.id, meta.created, meta.model, std::move(c.text), std::move(c.tool_calls), c.finish == "length",
            usage()};
  }
  // The Responses API's stream (responses.h): created and in_progress, the message's item and
  // part, text deltas, then each item done and completed (or incomplete); with tools, the answer's
  // text or its calls (each call's item added, its arguments in pieces, done once the next call
  // starts or the answer ends) as they are written. False once the client is gone.
  bool write_responses(httplib::DataSink& sink) {
    auto write = [&](const std::string& s) { return send(sink, s); };
    const std::string item = message_id(meta.id);
    const Json part{{"type", "output_text"}, {"text", ""}, {"annotations", Json::array()}, {"logprobs", Json::array()}};
    auto open_message = [&] {
      message_open = true;
      std::string s = event({{"output_index", 0},
                             {"item", {{"type", "message"}, {"id", item}, {"status", "in_progress"},
                                       {"role", "assistant"}, {"content", Json::array()}}}},
                            "response.output_item.added", events);
      return s + event({{"item_id", item}, {"output_index", 0}, {"content_index", 0}, {"part", part}},
                       "response.content_part.added", events);
    };
    auto call_done = [&](size_t k, const Json& it) {
      calls_done = k + 1;
      return event({{"item_id", it["id"]}, {"output_index", k}, {"name", it["name"]}, {"arguments", it["arguments"]}},
                   "response.function_call_arguments.done", events) +
             event({{"output_index", k}, {"item", it}}, "response.output_item.done", events);
    };
    if (!started) {
      started = true;
      ResponseOut r{meta.id, meta.created, meta.model, {}, {}, false, {}};
      std::string head = event({{"response", response_json(r, *responses, "in_progress")}}, "response.created", events);
      head += event({{"response", response_json(r, *responses, "in_progress")}}, "response.in_progress", events);
      if (!tool_answer) head += open_message();
      return write(head);
    }
    bool done = false;
    if (auto end = poll_events(sink, done, [](const ApiError& e) { return sse(error_json(e)); })) return *end;
    std::string out, text;
    if (!tool_answer) {
      text = take_out(0).text;
    } else {
      ToolAnswerReader& reader = choices[0].reader;
      ToolAnswerReader::Delta d = reader.feed(std::exchange(choices[0].out.text, {}));
      text = std::move(d.content);
      for (const ToolCallDelta& p : d.calls) {
        const std::string id = call_item_id(meta.id, p.index);
        if (!p.id.empty()) {
          if (p.index > 0) out += call_done(p.index - 1, function_call_item(meta.id, p.index - 1, reader.calls()[p.index - 1]));
          Json added = function_call_item(meta.id, p.index, {p.id, p.name, ""});
          added["status"] = "in_progress";
          out += event({{"output_index", p.index}, {"item", added}}, "response.output_item.added", events);
        }
        if (!p.arguments.empty())
          out += event({{"item_id", id}, {"output_index", p.index}, {"delta", p.arguments}},
                       "response.function_call_arguments.delta", events);
      }
    }
    if (!text.empty()) {
      if (!message_open) out += open_message();
      said += text;
      out += event({{"item_id", item}, {"output_index", 0}, {"content_index", 0}, {"delta", text},
                    {"logprobs", Json::array()}},
                   "response.output_text.delta", events);
    }
    if (done) {
      ResponseOut r = response_out();
      r.text = said;
      const Json items = output_items(r);
      if (r.calls.empty() && !message_open) out += open_message();
      for (size_t k = calls_done; k < items.size(); ++k) {
        const Json& it = items[k];
        if (it["type"] == "function_call") {
          out += call_done(k, it);
          continue;
        }
        const Json& text_part = it["content"][0];
        out += event({{"item_id", item}, {"output_index", k}, {"content_index", 0}, {"text", text_part["text"]},
                      {"logprobs", Json::array()}},
                     "response.output_text.done", events);
        out += event({{"item_id", item}, {"output_index", k}, {"content_index", 0}, {"part", text_part}},
                     "response.content_part.done", events);
        out += event({{"output_index", k}, {"item", it}}, "response.output_item.done", events);
      }
      const std::string status = r.incomplete ? "incomplete" : "completed";
      out += event({{"response", response_json(r, *responses, status)}},
                   r.incomplete ? "response.incomplete" : "response.completed", events);
    }
    if (!out.empty() && !write(out)) return false;
    if (done) sink.done();
    return true;
  }
  // Anthropic's Message, once its one choice has finished (`text`: what the stream already sent).
  MessageOut message_out(const std::string* text = nullptr) {
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
  // Anthropic's stream (messages.h): message_start, the text block, text deltas, each block's
  // stop, message_delta with the stop reason and usage, message_stop; with tools, the answer's
  // text or its tool_use blocks (each started with an empty input, its JSON in pieces, stopped
  // once the next one starts or the answer ends) as they are written. False once the client is
  // gone.
  bool write_anthropic(httplib::DataSink& sink) {
    auto write = [&](const std::string& s) { return send(sink, s); };
    auto ev = [](const char* type, Json e) {
      Json out{{"type", type}};
      for (auto& [key, value] : e.items()) out[key] = std::move(value);
      return fmt::format("event: {}\ndata: {}\n\n", type, dump(out));
    };
    auto text_start = [&] {
      message_open = true;
      return ev("content_block_start", {{"index", 0}, {"content_block", {{"type", "text"}, {"text", ""}}}});
    };
    auto stop_block = [&](size_t k) {
      calls_done = k + 1;
      return ev("content_block_stop", {{"index", k}});
    };
    if (!started) {
      started = true;
      MessageOut m{meta.id, meta.model, {}, {}, {}, {}, prompt_tokens, 0, 0};
      std::string head = ev("message_start", {{"message", message_json(m, true)}});
      if (!tool_answer) head += text_start();
      return write(head);
    }
    bool done = false;
    if (auto end = poll_events(sink, done, [&](const ApiError& e) { return ev("error", anthropic_error_json(e)); }))
      return *end;
    std::string out, text;
    if (!tool_answer) {
      text = take_out(0).text;
    } else {
      ToolAnswerReader::Delta d = choices[0].reader.feed(std::exchange(choices[0].out.text, {}));
      text = std::move(d.content);
      for (const ToolCallDelta& p : d.calls) {
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
    }
    if (!text.empty()) {
      if (!message_open) out += text_start();
      said += text;
      out += ev("content_block_delta", {{"index", 0}, {"delta", {{"type", "text_delta"}, {"text", text}}}});
    }
    if (done) {
      const MessageOut m = message_out(&said);
      if (m.calls.empty() && !message_open) out += text_start();
      for (size_t k = calls_done; k < std::max<size_t>(m.calls.size(), 1); ++k) out += stop_block(k);
      out += ev("message_delta", {{"delta", {{"stop_reason", m.stop_reason}, {"stop_sequence", stop_sequence_json(m)}}},
                                  {"usage", message_json(m)["usage"]}});
      out += ev("message_stop", Json::object());
    }
    if (!out.empty() && !write(out)) return false;
    if (done) sink.done();
    return true;
  }
  // Each prompt once (its first choice's prompt and image rows), every choice's tokens.
  UsageOut usage() const {
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
};

HttpServer::HttpServer(ServerOptions opt) : opt_(std::move(opt)), http_(std::make_unique<httplib::Server>()) {
  routes();
}

HttpServer::~HttpServer() = default;

std::shared_ptr<const engine::Model> HttpServer::model() const {
  std::lock_guard lk(mu_);
  if (!model_) refuse(503, "the model is loading", {}, "model_loading");
  return model_;
}

int HttpServer::bind() {
  const SchedulerOptions& s = opt_.scheduler;
  // Each open connection (idle keep-alive ones too) holds a pool thread, and 0.11.4's queue behind
  // the pool is unbounded: size the pool for every request the scheduler may hold, plus slack.
  const size_t threads = opt_.http_threads > 0 ? size_t(opt_.http_threads)
                                               : size_t(std::max(s.budget.max_seqs, 1) + s.max_queue + 8);
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_->set_payload_max_length(opt_.max_body_bytes);
  http_->set_read_timeout(opt_.timeout_s);
  http_->set_write_timeout(opt_.timeout_s);
  http_->set_keep_alive_max_count(1000);
  http_->set_keep_alive_timeout(5);
  const int port = opt_.port == 0 ? http_->bind_to_any_port(opt_.host)
                                  : (http_->bind_to_port(opt_.host, opt_.port) ? opt_.port : -1);
  if (port < 0) fail("cannot listen on {}:{} (in use, or not an address of this machine)", opt_.host, opt_.port);
  return port;
}

void HttpServer::listen() { http_->listen_after_bind(); }

void HttpServer::set_model(std::shared_ptr<const engine::Model> model, const std::filesystem::path& dir) {
  defaults_ = load_generation_defaults(dir);
  auto sched = std::make_unique<Scheduler>(*model, opt_.scheduler, metrics_);
  std::lock_guard lk(mu_);
  model_id_ = !opt_.served_model_name.empty() ? opt_.served_model_name
                                              : std::filesystem::absolute(dir).lexically_normal().filename().string();
  if (model_id_.empty()) model_id_ = std::filesystem::absolute(dir).parent_path().filename().string();
  fingerprint_ = "fp_" + model->identity().hash_hex();
  created_ = int64_t(std::time(nullptr));
  scheduler_ = std::move(sched);
  model_ = std::move(model);
}

void HttpServer::shutdown() {
  if (stopping_.exchange(true)) return;
  Scheduler* s = nullptr;
  {
    std::lock_guard lk(mu_);
    s = scheduler_.get();
  }
  const auto deadline = Clock::now() + std::chrono::seconds(opt_.shutdown_timeout_s);
  if (s) {
    s->drain();
    if (!s->wait_idle(deadline)) {
      std::fprintf(stderr, "vlm serve: shutdown deadline passed; cancelling what is left\n");
      s->cancel_all();
      s->wait_idle(Clock::now() + std::chrono::seconds(5));
    }
  }
  // Let the responses of finished requests reach their clients before the sockets close.
  while (active_.load() > 0 && Clock::now() < deadline + std::chrono::seconds(5))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  http_->stop();
}

void HttpServer::routes() {
  httplib::Server& svr = *http_;

  // Runs before the body is read: 0.11.4 reads chunked and length-less bodies without any limit,
  // so those are refused here, and so is a Content-Length over the limit.
  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    auto stop = [&](const ApiError& e) {
      send_error(res, e);
      res.set_header("Connection", "close");  // the unread body must not be parsed as a request
      return httplib::Server::HandlerResponse::Handled;
    };
    if (req.method == "POST" || req.method == "PUT" || req.method == "PATCH" || req.method == "DELETE") {
      if (req.has_header("Transfer-Encoding"))
        return stop({411, "chunked request bodies are not accepted; send a Content-Length", {}, "length_required"});
      if (!req.has_header("Content-Length"))
        return stop({411, "a request body needs a Content-Length header", {}, "length_required"});
      const std::string& cl = req.get_header_value("Content-Length");
      if (cl.empty() || cl.size() > 19 || cl.find_first_not_of("0123456789") != std::string::npos)
        return stop({400, "malformed Content-Length header", {}, "invalid_request"});
      if (std::stoull(cl) > opt_.max_body_bytes)
        return stop({413, fmt::format("request body of {} bytes exceeds the limit of {} bytes", cl, opt_.max_body_bytes),
                     {}, "request_too_large"});
    }
    // /health, the chat page and /metrics stay public (load balancers and scrapers carry no key).
    const bool is_public = req.path == "/health" || req.path == "/" || req.path == "/metrics";
    if (!opt_.api_key.empty() && !is_public) {
      // OpenAI's clients send "Authorization: Bearer <key>", Anthropic's "x-api-key: <key>".
      const std::string auth = req.get_header_value("Authorization");
      const std::string want = "Bearer " + opt_.api_key;
      if (!same_secret(auth, want) && !(req.has_header("x-api-key") &&
                                        same_secret(req.get_header_value("x-api-key"), opt_.api_key))) {
        metrics_.add("requests_rejected_total", 1, "status=\"401\"");
        send_error(res, {401, auth.empty() ? "missing API key: send 'Authorization: Bearer <key>'"
                                           : "invalid API key", {}, "invalid_api_key"});
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const int status = res.status;
    std::string msg = status == 404 ? fmt::format("no route {} {}", req.method, printable(req.path))
                                    : fmt::format("HTTP error {}", status);
    send_json(res, status, error_json({status, msg, {}, status == 404 ? "not_found" : ""}));
  });
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string msg = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      msg += std::string(": ") + e.what();
    } catch (...) {
    }
    send_json(res, 500, error_json({500, msg, {}, "internal_error"}));
  });

  svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    std::lock_guard lk(mu_);
    if (stopping_)
      send_error(res, {503, "the server is shutting down", {}, "server_shutting_down"});
    else if (!model_)
      send_error(res, {503, "the model is loading", {}, "model_loading"});
    else if (!scheduler_->healthy())
      send_error(res, {503, "the engine stopped after an internal error", {}, "engine_dead"});
    else
      send_json(res, 200, {{"status", "ok"}});
  });

  svr.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(std::string(chat_page()), "text/html; charset=utf-8");
  });

  svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    std::string id;
    {
      std::lock_guard lk(mu_);
      id = model_id_;
    }
    res.set_content(metrics_.text(id), "text/plain; version=0.0.4");
  });

  auto model_card = [this](const engine::Model& m) {
    const ModelConfig& c = m.config();
    return json{{"id", model_id_},
                {"object", "model"},
                {"created", created_},
                {"owned_by", "vlm"},
                {"max_model_len", m.context()},
                {"capabilities", {{"vision", m.has_vision()}, {"chat", m.has_chat_template()}}},
                {"context_length", m.context()},
                {"architecture", c.architecture},
                {"mask_mode", std::string(mask_mode_name(m.host_options().mask_mode))},
                {"identity", m.identity().hash_hex()}};
  };
  svr.Get("/v1/models", [this, model_card](const httplib::Request&, httplib::Response& res) {
    try {
      auto m = model();
      send_json(res, 200, {{"object", "list"}, {"data", json::array({model_card(*m)})}});
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  });
  svr.Get(R"(/v1/models/(.+))", [this, model_card](const httplib::Request& req, httplib::Response& res) {
    try {
      auto m = model();
      if (req.matches[1] != model_id_)
        refuse(404, fmt::format("The model '{}' does not exist; this server serves '{}'",
                                printable(std::string(req.matches[1])), model_id_), "model", "model_not_found");
      send_json(res, 200, model_card(*m));
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  });

  // vLLM's tokenizer endpoints: what a request's prompt takes (images included) before sending it.
  svr.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    try {
      auto m = model();
      TokenizeRequest t = parse_tokenize(parse_body(req.body), opt_.images);
      check_model(t.request.model);
      const std::vector<vision::RgbImage> images = request_images(*m, t.request, opt_.limits);
      std::vector<int32_t> ids = prompt_ids(*m, t.request, 0, images);
      // raw_prompt puts <bos> first unless the text has it; without special tokens, only then.
      const text::Tokenizer& tok = *m->tokenizer();
      if (t.request.endpoint == Endpoint::Completion && !t.add_special_tokens && !ids.empty() &&
          tok.token_id(tok.bos_token()) == ids[0] && t.request.prompts[0].text.rfind(tok.bos_token(), 0) != 0)
        ids.erase(ids.begin());
      json out{{"count", ids.size()}, {"max_model_len", m->context()}, {"tokens", ids}};
      if (t.return_token_strs) {
        out["token_strs"] = json::array();
        for (int32_t id : ids) out["token_strs"].push_back(std::string(tok.token(id)));
      }
      send_json(res, 200, out);
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  });
  svr.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    try {
      auto m = model();
      const DetokenizeRequest d = parse_detokenize(parse_body(req.body));
      check_model(d.model);
      const text::Tokenizer* tok = m->tokenizer();
      if (!tok) refuse(400, "this model has no tokenizer.json", "tokens");
      for (int32_t id : d.tokens)
        if (id >= tok->vocab_size())
          refuse(400, fmt::format("token {} is outside the vocabulary [0, {})", id, tok->vocab_size()), "tokens");
      send_json(res, 200, {{"prompt", tok->decode(d.tokens)}});
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  });

  svr.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    generate(req.body, Endpoint::Chat, res);
  });
  svr.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    generate(req.body, Endpoint::Completion, res);
  });
  svr.Post("/v1/responses", [this](const httplib::Request& req, httplib::Response& res) {
    generate(req.body, Endpoint::Chat, res, Api::Responses);
  });
  svr.Post("/v1/messages", [this](const httplib::Request& req, httplib::Response& res) {
    generate(req.body, Endpoint::Chat, res, Api::Anthropic);
  });
}

void HttpServer::check_model(const std::string& name) const {
  if (!name.empty() && name != model_id_)
    refuse(404, fmt::format("The model '{}' does not exist; this server serves '{}'", printable(name), model_id_),
           "model", "model_not_found");
}

void HttpServer::generate(const std::string& body, Endpoint ep, httplib::Response& res, Api api) {
  auto st = std::make_shared<Stream>();
  const bool responses = api == Api::Responses;
  st->anthropic = api == Api::Anthropic;
  try {
    if (stopping_) refuse(503, "the server is shutting down", {}, "server_shutting_down");
    st->model = model();
    Scheduler* sched;
    {
      std::lock_guard lk(mu_);
      sched = scheduler_.get();
    }
    ApiRequest ar;
    std::vector<std::string> origin;  // Responses, Messages: the field of each chat message
    if (responses) {
      ResponsesRequest rr = parse_responses(parse_body(body), opt_.images);
      ar = std::move(rr.chat);
      st->responses = std::move(rr.echo);
      origin = std::move(rr.origin);
    } else if (st->anthropic) {
      MessagesRequest mr = parse_anthropic(parse_body(body), opt_.images);
      ar = std::move(mr.chat);
      origin = std::move(mr.origin);
    } else {
      ar = parse_request(parse_body(body), ep, opt_.images);
    }
    check_model(ar.model);
    st->endpoint = ep;
    st->n = ar.n;
    st->stream = ar.stream;
    st->include_usage = ar.include_usage;
    st->logprobs = ar.top_logprobs >= 0;
    st->echo = ar.echo;
    st->token_ids = ar.return_token_ids;
    st->tool_answer = ar.tool_answer;
    std::vector<engine::Request> reqs;
    try {
      reqs = prepare_requests(*st->model, ar, defaults_, opt_.limits);
    } catch (ApiError& e) {
      if (responses) name_for_responses(e, origin);
      if (st->anthropic) name_for_anthropic(e, origin);
      throw;
    }
    if (!reqs.empty()) st->prompt_tokens = int(reqs[0].prompt.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      Stream::Choice c;
      if (ar.echo) {  // the prompt as written; a token-id prompt as its text
        const Prompt& p = ar.prompts[i / size_t(ar.n)];
        c.prompt = p.ids ? st->model->tokenizer()->decode(*p.ids) : p.text;
      }
      if (reqs[i].prompt_logprobs >= 0) c.first_id = reqs[i].prompt.front(), c.scored = reqs[i].prompt.size() - 1;
      st->choices.push_back(std::move(c));
    }
    st->jobs = sched->submit(std::move(reqs));
  } catch (const ApiError& e) {
    metrics_.add("requests_rejected_total", 1, fmt::format("status=\"{}\"", e.status));
    send_error(res, e, st->anthropic);
    return;
  }
  const uint64_t n = ++next_id_;
  const char* prefix = responses ? "resp_" : st->anthropic ? "msg_" : ep == Endpoint::Chat ? "chatcmpl-" : "cmpl-";
  st->meta = {fmt::format("{}{:x}{:08x}", prefix, created_, n), int64_t(std::time(nullptr)), model_id_, fingerprint_};
  active_++;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Request-Id", st->meta.id);

  // The releaser runs when the response ends: success = false means the client went away.
  auto release = [this, st](bool success) {
    if (!success) st->cancel();
    active_--;
  };
  if (st->stream) {
    res.set_header("X-Accel-Buffering", "no");
    // Exactly "text/event-stream": 0.11.4 gzips any other type, buffering the events.
    res.set_chunked_content_provider(
        "text/event-stream",
        [st](size_t, httplib::DataSink& sink) {
          if (st->responses) return st->write_responses(sink);
          if (st->anthropic) return st->write_anthropic(sink);
          const bool chat = st->endpoint == Endpoint::Chat;
          auto write = [&](const std::string& s) {
            if (sink.write(s.data(), s.size())) return true;
            st->cancel();
            return false;
          };
          auto chunk = [&](const ChoiceOut& c) {
            return chat ? chat_delta_chunk(st->meta, c, st->logprobs, st->include_usage)
                        : completion_chunk(st->meta, c, st->logprobs, st->include_usage);
          };
          if (!st->started && chat) {
            st->started = true;
            std::string head;
            for (size_t i = 0; i < st->choices.size(); ++i) head += sse(chat_role_chunk(st->meta, int(i), st->include_usage));
            return write(head);
          }
          const bool all = st->poll(kPoll);
          if (!sink.is_writable()) {
            st->cancel();
            return false;
          }
          std::string events;
          const Stream::Choice* bad = st->failed();
          for (size_t i = 0; i < st->choices.size(); ++i) {
            Stream::Choice& c = st->choices[i];
            // The prompt first (echo), once it is scored where logprobs are asked for.
            if (st->echo && !c.echoed) {
              if (c.out.prompt_tokens.size() < c.scored && !c.done) continue;
              c.echoed = true;
              events += sse(chunk(st->echo_out(i)));
            }
            const bool finishing = c.done && !c.sent && !bad;
            // Tokens without text yet (a character or a possible stop string held back) ride on
            // the next chunk, or on the finish.
            if (st->tool_answer) {
              if (std::optional<ChoiceOut> d = st->tool_delta(i, finishing)) {
                if (finishing && (!d->text.empty() || !d->call_deltas.empty())) {  // what is new, then the finish
                  ChoiceOut body = *d;
                  body.finish.clear();
                  events += sse(chunk(body));
                  d->text.clear(), d->call_deltas.clear(), d->tokens.clear(), d->token_ids.reset();
                }
                events += sse(chunk(*d));
              }
            } else if (!c.out.text.empty() || (st->logprobs && !c.out.tokens.empty())) {
              events += sse(chunk(st->take_out(i)));
            }
            if (finishing && !st->tool_answer) {
              ChoiceOut fin = st->finished_out(i);
              if (!fin.text.empty()) {  // what is left, then the finish
                ChoiceOut body = fin;
                body.finish.clear();
                events += sse(chunk(body));
                fin.text.clear(), fin.tokens.clear(), fin.token_ids.reset();
              }
              events += sse(chunk(fin));
            }
            c.sent = c.sent || finishing;
          }
          if (bad) {
            // openai-node raises an APIError for an event with an "error" key.
            st->cancel();
            events += sse(error_json({500, Stream::error_message(*bad), {}, "internal_error"})) + "data: [DONE]\n\n";
            if (!write(events)) return false;
            sink.done();
            return true;
          }
          if (all) {
            if (st->include_usage) events += sse(usage_chunk(st->meta, st->endpoint, st->usage()));
            events += "data: [DONE]\n\n";
          }
          if (!events.empty() && !write(events)) return false;
          if (all) sink.done();
          return true;
        },
        release);
  } else {
    // Not streamed, yet still a chunked provider: it is the only place 0.11.4 lets a handler see
    // that the client left while the answer is being computed.
    res.set_chunked_content_provider(
        "application/json",
        [st](size_t, httplib::DataSink& sink) {
          const bool all = st->poll(kPoll);
          if (!sink.is_writable()) {
            st->cancel();
            return false;
          }
          const Stream::Choice* bad = st->failed();
          if (!all && !bad) return true;
          json body;
          if (bad) {
            st->cancel();
            const ApiError e{500, Stream::error_message(*bad), {}, "internal_error"};
            body = st->anthropic ? anthropic_error_json(e) : error_json(e);
          } else if (st->anthropic) {
            body = message_json(st->message_out());
          } else if (st->responses) {
            const ResponseOut r = st->response_out();
            body = response_json(r, *st->responses, r.incomplete ? "incomplete" : "completed");
          } else {
            std::vector<ChoiceOut> choices;
            for (size_t i = 0; i < st->choices.size(); ++i) choices.push_back(st->whole_out(i));
            body = st->endpoint == Endpoint::Chat ? chat_response(st->meta, choices, st->logprobs, st->usage())
                                                  : completion_response(st->meta, choices, st->logprobs, st->usage());
          }
          const std::string s = dump(body);
          if (!sink.write(s.data(), s.size())) {
            st->cancel();
            return false;
          }
          sink.done();
          return true;
        },
        release);
  }
}

}  // namespace vlm::server
