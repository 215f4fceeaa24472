// `vlm serve`: the OpenAI-compatible HTTP server (src/server/http_server.h). It listens at
// once and loads the model behind it (/health is 503 until ready). SIGTERM or SIGINT stops
// admitting, lets running requests finish within --shutdown-timeout, then exits 0.
#include <CLI/CLI.hpp>
#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "cli/commands.h"
#include "cli/engine_args.h"
#include "core/error.h"
#include "server/http_server.h"

namespace vlm::cli {

int cmd_serve(int argc, char** argv) {
  CLI::App app{"OpenAI-compatible HTTP server (chat completions, completions, models, metrics, chat page)"};
  EngineArgs ea;
  ea.add(app);
  server::ServerOptions so;
  app.add_option("--host", so.host, "address to listen on (default 127.0.0.1: this machine only)");
  app.add_option("--port", so.port, "port (0: any free port)")->check(CLI::Range(0, 65535));
  app.add_option("--api-key", so.api_key, "require 'Authorization: Bearer KEY' (default: $VLM_API_KEY)");
  app.add_option("--served-model-name", so.served_model_name, "model id clients use (default: the folder's name)");
  app.add_flag("--allow-file-images", so.images.allow_files,
               "accept file:// image URLs (reads any file this process can; off by default)");
  size_t max_body_mb = so.max_body_bytes >> 20;
  app.add_option("--max-body-mb", max_body_mb, "largest request body in MiB")->check(CLI::Range(1, 4096));
  app.add_option("--shutdown-timeout", so.shutdown_timeout_s, "seconds running requests get after SIGTERM")
      ->check(CLI::Range(0, 86400));
  app.add_option("--timeout", so.timeout_s, "socket read/write timeout in seconds")->check(CLI::Range(1, 86400));
  app.add_option("--http-threads", so.http_threads, "HTTP worker threads (0: max-seqs + max-queue + 8)")
      ->check(CLI::Range(0, 65536));
  CLI11_PARSE(app, argc, argv);
  so.max_body_bytes = max_body_mb << 20;
  so.images.max_images = ea.max_images;
  so.scheduler = ea.scheduler_options();
  if (so.api_key.empty())
    if (const char* k = std::getenv("VLM_API_KEY")) so.api_key = k;
  // TEST-ONLY (server/scheduler.h): read here, from the environment, and nowhere else.
  if (const char* p = std::getenv("VLM_TEST_STEP_PAUSE_MS")) so.scheduler.test_step_pause = std::chrono::milliseconds(std::atoi(p));

  // Signals go to one thread (sigwait), blocked everywhere else, so every thread started from
  // here on inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  server::HttpServer srv(so);
  const int port = srv.bind();
  std::fprintf(stderr, "vlm serve: listening on http://%s:%d (loading %s)\n", so.host.c_str(), port,
               ea.model_dir.c_str());
  std::thread http([&] { srv.listen(); });
  std::thread sig([&] {
    int s = 0;
    sigwait(&stop_signals, &s);
    std::fprintf(stderr, "vlm serve: %s: finishing running requests, then exiting\n", s == SIGTERM ? "SIGTERM" : "SIGINT");
    srv.shutdown();
  });
  int rc = 0;
  try {
    srv.set_model(engine::Model::load(ea.model_dir, ea.model_options()), ea.model_dir);
    if (const size_t kv = so.scheduler.budget.kv_bytes)
      std::fprintf(stderr, "vlm serve: ready (KV memory budget %zu MiB)\n", kv >> 20);
    else
      std::fprintf(stderr, "vlm serve: ready (no KV memory budget)\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vlm serve: error: %s\n", e.what());
    rc = 1;
    pthread_kill(sig.native_handle(), SIGTERM);
  }
  http.join();
  sig.join();
  std::fprintf(stderr, "vlm serve: stopped\n");
  return rc;
}

}  // namespace vlm::cli
