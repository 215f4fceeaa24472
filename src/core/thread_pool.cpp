#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>

namespace vlm {

namespace {
std::pair<size_t, size_t> chunk(size_t n, int parts, int i) {
  size_t per = n / size_t(parts), extra = n % size_t(parts);
  size_t begin = size_t(i) * per + std::min<size_t>(size_t(i), extra);
  return {begin, begin + per + (size_t(i) < extra ? 1 : 0)};
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  for (int i = 1; i < std::max(1, n_threads); ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn) {
  if (workers_.empty() || n < 2) {
    if (n) fn(0, n);
    return;
  }
  {
    std::lock_guard lock(mu_);
    job_ = &fn;
    job_n_ = n;
    pending_ = int(workers_.size());
    ++generation_;
  }
  start_cv_.notify_all();
  auto [b, e] = chunk(n, size(), 0);
  if (b < e) fn(b, e);
  std::unique_lock lock(mu_);
  done_cv_.wait(lock, [this] { return pending_ == 0; });
  job_ = nullptr;
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(size_t, size_t)>* job;
    size_t n;
    {
      std::unique_lock lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
    }
    auto [b, e] = chunk(n, size(), index);
    if (b < e) (*job)(b, e);
    {
      std::lock_guard lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

int default_threads() {
  if (const char* s = std::getenv("VLM_THREADS")) {
    int n = std::atoi(s);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace vlm
