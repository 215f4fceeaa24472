#include "server/scheduler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <exception>

#include "server/protocol.h"

namespace vlm::server {

namespace {
double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

std::string finish_text(engine::FinishReason r) { return r == engine::FinishReason::Length ? "length" : "stop"; }

void wait_any(const JobGroup& group, std::chrono::milliseconds timeout) {
  if (group.empty()) return;
  Job::Signal& sig = *group.front()->signal_;
  std::unique_lock lk(sig.mu);
  sig.cv.wait_for(lk, timeout,
                  [&] { return std::any_of(group.begin(), group.end(), [](auto& j) { return j->has_news(); }); });
}

bool Job::take(JobOutput& out, std::chrono::milliseconds timeout) {
  std::unique_lock lk(signal_->mu);
  signal_->cv.wait_for(lk, timeout, [&] { return has_news(); });
  out.text += pending_.text;
  for (auto& t : pending_.prompt_tokens) out.prompt_tokens.push_back(std::move(t));
  pending_.prompt_tokens.clear();
  pending_.text.clear();
  for (auto& t : pending_.tokens) out.tokens.push_back(std::move(t));
  pending_.tokens.clear();
  if (finished_) {
    finish_taken_ = true;
    out.finish = pending_.finish;
    out.stop_reason = pending_.stop_reason;
    out.usage = pending_.usage;
    out.error = pending_.error;
  }
  return finished_;
}

void Job::cancel() {
  if (cancelled_.exchange(true)) return;
  const engine::Phase phase = seq_->phase();
  seq_->cancel();
  if (owner_ && phase != engine::Phase::Finished) owner_->note_cancel(*this);
}

Scheduler::Scheduler(const engine::Model& model, const SchedulerOptions& opt, Metrics& metrics)
    : model_(model), opt_(opt), metrics_(metrics), engine_(model, opt.budget) {
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  cancel_all();
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Scheduler::note_cancel(Job& job) {
  metrics_.add("requests_cancelled_total", 1,
               fmt::format("phase=\"{}\"", engine::phase_name(job.seq_->phase())));
  cv_.notify_all();
}

engine::Callbacks Scheduler::callbacks(const std::shared_ptr<Job>& job) {
  engine::Callbacks cb;
  // The callbacks run on the engine thread. They hold the job weakly: the job owns the sequence,
  // and the engine may outlive a job whose client is gone (it then ends the sequence unseen).
  const std::weak_ptr<Job> weak = job;
  cb.on_token = [this, weak](const engine::TokenEvent& ev) {
    const std::shared_ptr<Job> j = weak.lock();
    if (!j) return;
    const auto now = Clock::now();
    if (!j->got_token_)
      metrics_.observe("time_to_first_token_seconds", seconds(now - j->arrival_));
    else
      metrics_.observe("inter_token_latency_seconds", seconds(now - j->last_token_));
    j->got_token_ = true;
    j->last_token_ = now;
    metrics_.add("generation_tokens_total");
    if (j->cancelled_.load()) metrics_.add("tokens_after_cancel_total");
    std::lock_guard lk(j->signal_->mu);
    j->pending_.tokens.push_back(ev);
    j->signal_->cv.notify_all();
  };
  cb.on_prompt_token = [weak](const engine::TokenEvent& ev) {
    const std::shared_ptr<Job> j = weak.lock();
    if (!j) return;
    std::lock_guard lk(j->signal_->mu);
    j->pending_.prompt_tokens.push_back(ev);
    j->signal_->cv.notify_all();
  };
  cb.on_text = [weak](std::string_view t) {
    const std::shared_ptr<Job> j = weak.lock();
    if (!j) return;
    std::lock_guard lk(j->signal_->mu);
    j->pending_.text += t;
    j->signal_->cv.notify_all();
  };
  cb.on_finish = [this, weak](engine::FinishReason r, const engine::Usage& u) {
    metrics_.add("request_success_total", 1, fmt::format("finished_reason=\"{}\"", engine::finish_name(r)));
    metrics_.add("prompt_tokens_total", u.prompt_tokens);
    if (u.cached_tokens) metrics_.add("prompt_tokens_cached_total", u.cached_tokens);
    const std::shared_ptr<Job> j = weak.lock();
    if (!j) return;
    metrics_.observe("e2e_request_latency_seconds", seconds(Clock::now() - j->arrival_));
    std::lock_guard lk(j->signal_->mu);
    if (j->finished_) return;  // already ended by the scheduler (shutdown)
    j->pending_.finish = r;
    j->pending_.stop_reason = j->seq_->stop_reason();
    j->pending_.usage = u;
    if (r == engine::FinishReason::Error) j->pending_.error = j->seq_->error();
    j->finished_ = true;
    j->signal_->cv.notify_all();
  };
  return cb;
}

JobGroup Scheduler::submit(std::vector<engine::Request> reqs, bool block) {
  // A request that could never be admitted is the client's to fix (a 400, not a wait forever).
  if (reqs.size() > size_t(opt_.max_queue))
    refuse(400, fmt::format("{} choices are more than this server queues at once ({})", reqs.size(), opt_.max_queue),
           "n", "too_many_choices");
  for (const engine::Request& req : reqs)
    if (const size_t budget = opt_.budget.kv_bytes;
        budget > 0 && engine::kv_reservation(model_, req, opt_.budget.row_log()) > budget)
      refuse(400, engine::kv_budget_error(model_, req, budget, opt_.budget.row_log()), "max_tokens",
             "kv_budget_exceeded");
  const auto signal = std::make_shared<Job::Signal>();
  JobGroup group;
  uint64_t image_bytes = 0;
  for (engine::Request& req : reqs) {
    auto job = std::make_shared<Job>();
    Job* j = job.get();
    j->owner_ = this;
    j->signal_ = signal;
    for (const auto& im : req.images) j->image_bytes_ += im.rgb.size();
    image_bytes += j->image_bytes_;
    j->arrival_ = Clock::now();
    j->seq_ = std::make_shared<engine::Sequence>(model_, std::move(req), callbacks(job));
    group.push_back(std::move(job));
  }

  std::unique_lock lk(mu_);
  auto full = [&] {
    return waiting_ + group.size() > size_t(opt_.max_queue) ||
           (waiting_ > 0 && queued_image_bytes_ + image_bytes > opt_.max_queued_image_bytes);
  };
  for (;;) {
    if (draining_ || stop_) refuse(503, "the server is shutting down", {}, "server_shutting_down");
    if (!healthy_) refuse(503, "the engine stopped after an internal error", {}, "engine_dead");
    if (!full()) break;
    if (!block)
      refuse(429, fmt::format("the queue is full ({} requests waiting, {} MiB of images); retry shortly", waiting_,
                              queued_image_bytes_ >> 20), {}, "queue_full");
    room_cv_.wait(lk);
  }
  inbox_.insert(inbox_.end(), group.begin(), group.end());
  waiting_ += group.size();
  queued_image_bytes_ += image_bytes;
  metrics_.set("num_requests_waiting", double(waiting_));
  cv_.notify_all();
  return group;
}

void Scheduler::drain() {
  draining_ = true;
  room_cv_.notify_all();
}

bool Scheduler::wait_idle(Clock::time_point deadline) {
  std::unique_lock lk(mu_);
  return idle_cv_.wait_until(lk, deadline, [&] { return inbox_.empty() && live_.empty(); });
}

void Scheduler::cancel_all() {
  std::vector<std::shared_ptr<Job>> jobs;
  {
    std::lock_guard lk(mu_);
    jobs.assign(inbox_.begin(), inbox_.end());
    jobs.insert(jobs.end(), live_.begin(), live_.end());
  }
  for (auto& j : jobs) j->cancel();
}

void Scheduler::update_queue_state() {
  std::lock_guard lk(mu_);
  size_t queued = inbox_.size();
  for (auto& j : live_) {
    if (j->queued_ && j->seq_->phase() != engine::Phase::Queued) {
      j->queued_ = false;
      queued_image_bytes_ -= j->image_bytes_;
      metrics_.observe("request_queue_time_seconds", seconds(Clock::now() - j->arrival_));
    }
    queued += j->queued_;
  }
  std::erase_if(live_, [&](const std::shared_ptr<Job>& j) {
    std::lock_guard jl(j->signal_->mu);
    if (j->finished_ && j->queued_) queued_image_bytes_ -= j->image_bytes_, --queued;
    return j->finished_;
  });
  waiting_ = queued;
  metrics_.set("num_requests_waiting", double(waiting_));
  metrics_.set("num_requests_running", double(engine_.running()));
  metrics_.set("kv_cache_bytes", double(engine_.kv_bytes()));
  if (opt_.budget.kv_bytes > 0)
    metrics_.set("kv_cache_usage_perc", double(engine_.kv_reserved()) / double(opt_.budget.kv_bytes));
  room_cv_.notify_all();
  if (inbox_.empty() && live_.empty()) idle_cv_.notify_all();
}

void Scheduler::loop() {
  for (;;) {
    std::deque<std::shared_ptr<Job>> fresh;
    {
      std::unique_lock lk(mu_);
      if (inbox_.empty() && engine_.idle() && !stop_) cv_.wait_for(lk, std::chrono::milliseconds(100));
      if (stop_) break;
      fresh.swap(inbox_);
      for (auto& j : fresh) live_.push_back(j);
    }
    for (auto& j : fresh) engine_.add(j->seq_);
    if (!engine_.idle()) {
      try {
        const auto t0 = Clock::now();
        const engine::StepStats st = engine_.step();
        metrics_.observe("engine_step_seconds", seconds(Clock::now() - t0));
        metrics_.add("engine_steps_total");
        if (st.images) metrics_.add("images_encoded_total", st.images);
        if (st.images_cached) metrics_.add("image_cache_hits_total", st.images_cached);
        if (st.drafted) metrics_.add("spec_decode_num_draft_tokens_total", st.drafted);
        if (st.accepted) metrics_.add("spec_decode_num_accepted_tokens_total", st.accepted);
        if (opt_.budget.draft_tokens > 0) metrics_.set("draft_row_cost", engine_.draft_row_cost());
        metrics_.set("image_cache_bytes", double(engine_.image_cache_bytes()));
        metrics_.set("prefix_cache_bytes", double(engine_.prefix_cache_bytes()));
      } catch (const std::exception& e) {
        // A bug, not a request's fault: requests were validated before admission. Fail every
        // request still live so no client waits forever, and refuse new ones.
        std::fprintf(stderr, "vlm: engine step failed: %s\n", e.what());
        healthy_ = false;
        end_all(engine::FinishReason::Error, std::string("internal error: ") + e.what());
        return;
      }
    }
    update_queue_state();
    if (opt_.test_step_pause.count() > 0) std::this_thread::sleep_for(opt_.test_step_pause);
  }
  // Shutting down: whatever is left ends as cancelled so no submitter waits forever.
  end_all(engine::FinishReason::Cancelled, {});
}

void Scheduler::end_all(engine::FinishReason r, const std::string& error) {
  std::lock_guard lk(mu_);
  auto end = [&](const std::shared_ptr<Job>& j) {
    std::lock_guard jl(j->signal_->mu);
    if (j->finished_) return;
    j->pending_.finish = r;
    j->pending_.error = error;
    j->finished_ = true;
    j->signal_->cv.notify_all();
  };
  std::for_each(inbox_.begin(), inbox_.end(), end);
  std::for_each(live_.begin(), live_.end(), end);
  inbox_.clear();
  live_.clear();
  waiting_ = 0;
  idle_cv_.notify_all();
  room_cv_.notify_all();
}

}  // namespace vlm::server
