// The scheduler behind `vlm serve` and `vlm batch`: ONE thread owns the engine and calls
// step() in a loop, so every step decodes all running sequences together plus a bounded
// slice of prompt chunks and image encodes (engine/engine.h). Other threads submit requests
// through a bounded queue (requests and not-yet-encoded image bytes) and get each request's
// output through its own Job: a thread-safe channel the engine's callbacks fill and the
// submitter drains (the SSE writer, the batch writer). Job::cancel() sets that request's own
// cancel flag; the engine drops it at its next step in whatever phase it is. A request with
// several choices is a group of jobs submitted together, one per choice, whose submitter waits
// on all of them at once (wait_any).
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "server/metrics.h"

namespace vlm::server {

using Clock = std::chrono::steady_clock;

// What the engine produced for a request since the last take().
struct JobOutput {
  std::string text;                         // user-visible text (stop strings cut)
  std::vector<engine::TokenEvent> tokens;   // generated tokens (logprobs)
  std::vector<engine::TokenEvent> prompt_tokens;  // prompt tokens after the first (prompt_logprobs)
  std::optional<engine::FinishReason> finish;
  engine::StopReason stop_reason;           // with FinishReason::Stop
  engine::Usage usage;                      // with finish
  std::string error;                        // with FinishReason::Error
};

// A finished answer's finish_reason on the wire: "length" or "stop".
std::string finish_text(engine::FinishReason r);

class Job;
using JobGroup = std::vector<std::shared_ptr<Job>>;

// Waits up to `timeout` until a job of `group` (one submit's) has output or has finished and not
// yet handed its finish to take().
void wait_any(const JobGroup& group, std::chrono::milliseconds timeout);

class Job {
 public:
  // Waits up to `timeout` for output; moves what there is into `out` (appending). Returns true
  // once the finish is in `out`.
  bool take(JobOutput& out, std::chrono::milliseconds timeout);
  // The client is gone: the engine stops this request at its next step. Thread-safe, idempotent.
  void cancel();
  const std::shared_ptr<engine::Sequence>& sequence() const { return seq_; }

 private:
  friend class Scheduler;
  std::shared_ptr<engine::Sequence> seq_;
  uint64_t image_bytes_ = 0;  // decoded pixels held until the images are encoded
  Clock::time_point arrival_, last_token_;
  bool queued_ = true, got_token_ = false;
  std::atomic<bool> cancelled_{false};
  // Shared by the jobs of one group: the engine's callbacks wake whoever waits on any of them.
  struct Signal {
    std::mutex mu;
    std::condition_variable cv;
  };
  std::shared_ptr<Signal> signal_;
  JobOutput pending_;
  bool finished_ = false, finish_taken_ = false;
  bool has_news() const {
    return !pending_.text.empty() || !pending_.tokens.empty() || !pending_.prompt_tokens.empty() ||
           (finished_ && !finish_taken_);
  }
  friend void wait_any(const JobGroup& group, std::chrono::milliseconds timeout);
  class Scheduler* owner_ = nullptr;
};

struct SchedulerOptions {
  engine::StepBudget budget;                  // max_seqs and kv_bytes bound the batch
  int max_queue = 64;                         // requests waiting for a place in the batch
  uint64_t max_queued_image_bytes = 512u << 20;  // decoded pixels of waiting requests
  // TEST-ONLY: a pause after every engine step, so tests can act while a request is in a given
  // phase (e.g. disconnect while its images are being encoded). Never set outside tests.
  std::chrono::milliseconds test_step_pause{0};
};

class Scheduler {
 public:
  Scheduler(const engine::Model& model, const SchedulerOptions& opt, Metrics& metrics);
  ~Scheduler();  // cancels what is left and joins the engine thread

  // Queues a request's choices, one job each, all or none. Throws ApiError: 429 when the queue
  // is full (requests or image bytes), 503 once draining, 400 for more choices than the queue
  // holds. `block` (vlm batch) waits for room instead of refusing.
  JobGroup submit(std::vector<engine::Request> reqs, bool block = false);
  // Stops admitting (new submits get 503); running and queued requests go on.
  void drain();
  bool draining() const { return draining_.load(); }
  // Waits until nothing is queued or running, or the deadline passes; true when idle.
  bool wait_idle(Clock::time_point deadline);
  // Cancels every live request.
  void cancel_all();
  // False once an engine step threw (a bug): every live job then finished with Error.
  bool healthy() const { return healthy_.load(); }

 private:
  friend class Job;
  void loop();
  engine::Callbacks callbacks(const std::shared_ptr<Job>& job);  // fill the job from the engine thread
  void note_cancel(Job& job);
  void update_queue_state();  // queued flags, waiting counts, image bytes, gauges
  // Finishes every queued and live job with `r` (the engine thread died or the server stops).
  void end_all(engine::FinishReason r, const std::string& error);

  const engine::Model& model_;
  SchedulerOptions opt_;
  Metrics& metrics_;
  engine::Engine engine_;
  std::mutex mu_;
  std::condition_variable cv_, room_cv_, idle_cv_;
  std::deque<std::shared_ptr<Job>> inbox_;  // submitted, not yet handed to the engine
  std::vector<std::shared_ptr<Job>> live_;  // handed to the engine, not finished
  size_t waiting_ = 0;                      // submitted, not yet taken into the batch
  uint64_t queued_image_bytes_ = 0;
  std::atomic<bool> stop_{false}, draining_{false}, healthy_{true};
  std::thread thread_;
};

}  // namespace vlm::server
