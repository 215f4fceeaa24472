#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>
#include <system_error>
#include <utility>

#include "core/error.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace vlm {

namespace {
void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}
// Pause iterations a worker spins for a new loop before it sleeps (~0.1–1 ms): longer
// than the gap between two matrix products of a decode step, short enough that an idle
// pool gives its cores back.
constexpr int kSpin = 20000;
}  // namespace

int ThreadPool::max_threads() {
  return std::max(256, 4 * int(std::thread::hardware_concurrency()));
}

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads > max_threads())
    fail("thread count {} is above the limit of {} (4x the {} hardware threads, at least 256)", n_threads,
         max_threads(), std::thread::hardware_concurrency());
  const int n = std::max(1, n_threads);
  workers_.reserve(size_t(n - 1));
  for (int i = 1; i < n; ++i) {
    try {
      workers_.emplace_back([this] { worker(); });
    } catch (const std::system_error& e) {
      shutdown();  // the workers already running would otherwise wait forever
      fail("cannot start thread {} of {}: {}", i + 1, n, e.what());
    }
  }
}

ThreadPool::~ThreadPool() { shutdown(); }

void ThreadPool::shutdown() {
  stop_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (auto& t : workers_)
    if (t.joinable()) t.join();
  workers_.clear();
}

void ThreadPool::run_chunks() {
  const size_t n = job_n_, g = job_grain_;
  try {
    for (;;) {
      const size_t b = next_.fetch_add(g, std::memory_order_relaxed);
      if (b >= n) return;
      (*job_)(b, std::min(n, b + g));
    }
  } catch (...) {
    // Keep the first error for the caller; the other threads finish the loop's ranges.
    std::lock_guard lock(error_mu_);
    if (!error_) error_ = std::current_exception();
  }
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t grain) {
  if (n == 0) return;
  if (grain == 0) grain = std::max<size_t>(1, (n + 4 * size_t(size()) - 1) / (4 * size_t(size())));
  if (workers_.empty() || grain >= n) {
    fn(0, n);
    return;
  }
  job_ = &fn;
  job_n_ = n;
  job_grain_ = grain;
  next_.store(0, std::memory_order_relaxed);
  pending_.store(int(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  run_chunks();
  // Spin while the workers finish their last ranges; if one has lost its core (more
  // runnable threads than cores), sleep until it is done instead of burning our slice.
  for (int i = 0; i < kSpin && pending_.load(std::memory_order_acquire) != 0; ++i) cpu_relax();
  for (int p; (p = pending_.load(std::memory_order_acquire)) != 0;) pending_.wait(p, std::memory_order_acquire);
  job_ = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void ThreadPool::worker() {
  // Not the current value: a worker that starts late must still take the loop that the
  // caller may already have announced (the constructor runs before any loop).
  uint32_t seen = 0;
  for (;;) {
    uint32_t g = generation_.load(std::memory_order_acquire);
    for (int i = 0; g == seen && i < kSpin; ++i) {
      cpu_relax();
      g = generation_.load(std::memory_order_acquire);
    }
    if (g == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      continue;
    }
    seen = g;
    if (stop_.load()) return;
    run_chunks();
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
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
