// `vlm serve`: the OpenAI-compatible HTTP front of the scheduler, on Debian's cpp-httplib
// 0.11.4 (libcpp-httplib-dev). It listens before the model is loaded (/health answers 503
// until then), validates every request synchronously before any byte of the response is sent
// (so mistakes get their 4xx), and produces every generation response, streamed or not, from a
// chunked content provider that polls the client's socket, so a client that leaves cancels
// its request in whatever phase it is (cpp-httplib 0.11.4 has no is_connection_closed()).
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "engine/model.h"
#include "server/metrics.h"
#include "server/prepare.h"
#include "server/protocol.h"
#include "server/scheduler.h"

namespace httplib {
class Server;
struct Response;
}

namespace vlm::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                    // 0 = any free port
  std::string api_key;                // empty = no authentication
  std::string served_model_name;      // empty = the checkpoint folder's name
  ImagePolicy images;
  PrepareLimits limits;
  SchedulerOptions scheduler;
  size_t max_body_bytes = 64u << 20;  // request bodies (base64 images included)
  int http_threads = 0;               // 0 = max_seqs + max_queue + 8
  int timeout_s = 600;                // socket read/write timeout
  int shutdown_timeout_s = 30;        // SIGTERM: running requests get this long to finish
};

class HttpServer {
 public:
  explicit HttpServer(ServerOptions opt);
  ~HttpServer();

  // Binds the socket (before the model loads); returns the port.
  int bind();
  // Serves until shutdown() (blocks; call from its own thread).
  void listen();
  // The model is loaded: requests are served from now on.
  void set_model(std::shared_ptr<const engine::Model> model, const std::filesystem::path& dir);
  // Graceful stop: new requests get 503, running ones get shutdown_timeout_s to finish, then the
  // rest are cancelled and listen() returns.
  void shutdown();

 private:
  void routes();
  // The wire a generation request comes in: OpenAI's chat or completions, OpenAI's Responses
  // API or Anthropic's Messages API (both served as the chat request they mean).
  enum class Api { OpenAI, Responses, Anthropic };
  void generate(const std::string& body, Endpoint ep, httplib::Response& res, Api api = Api::OpenAI);
  void check_model(const std::string& name) const;  // 404 unless empty or the served model's id
  std::shared_ptr<const engine::Model> model() const;

  ServerOptions opt_;
  std::unique_ptr<httplib::Server> http_;
  Metrics metrics_;
  mutable std::mutex mu_;
  std::shared_ptr<const engine::Model> model_;
  std::unique_ptr<Scheduler> scheduler_;
  GenerationDefaults defaults_;
  std::string model_id_, fingerprint_;
  int64_t created_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> active_{0};  // responses still being written
  std::atomic<uint64_t> next_id_{0};
};

}  // namespace vlm::server
