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
#include "server/response_writer.h"

namespace vlm::server {

using json = Json;

namespace {

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
  // Anthropic's count of a Messages request's input tokens (llama.cpp's server answers it too):
  // the prompt as the request would run, images' soft tokens and the tools' instructions included.
  svr.Post("/v1/messages/count_tokens", [this](const httplib::Request& req, httplib::Response& res) {
    try {
      auto m = model();
      json body = parse_body(req.body);
      if (body.is_object() && !body.contains("max_tokens")) body["max_tokens"] = 1;  // a count has no answer
      MessagesRequest mr = parse_anthropic(body, opt_.images);
      check_model(mr.chat.model);
      try {
        const std::vector<vision::RgbImage> images = request_images(*m, mr.chat, opt_.limits);
        send_json(res, 200, {{"input_tokens", prompt_ids(*m, mr.chat, 0, images).size()}});
      } catch (ApiError& e) {
        name_for_anthropic(e, mr.origin);
        throw;
      }
    } catch (const ApiError& e) {
      send_error(res, e, true);
    }
  });
}

void HttpServer::check_model(const std::string& name) const {
  if (!name.empty() && name != model_id_)
    refuse(404, fmt::format("The model '{}' does not exist; this server serves '{}'", printable(name), model_id_),
           "model", "model_not_found");
}

void HttpServer::generate(const std::string& body, Endpoint ep, httplib::Response& res, Api api) {
  auto st = std::make_shared<ResponseWriter>();
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
    st->top_logprobs = ar.top_logprobs;
    st->prompt_logprobs = ar.prompt_logprobs;
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
      ResponseWriter::Choice c;
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
  // Exactly "text/event-stream": 0.11.4 gzips any other type, buffering the events. Not streamed,
  // still a chunked provider: it is the only place 0.11.4 lets a handler see that the client left
  // while the answer is being computed.
  if (st->stream) res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      st->stream ? "text/event-stream" : "application/json",
      [st](size_t, httplib::DataSink& sink) { return st->write(sink); }, release);
}

}  // namespace vlm::server
