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
  wake_.fetch_add(1);
  wake_.notify_all();
  for (auto& t : workers_)
    if (t.joinable()) t.join();
  workers_.clear();
}

void ThreadPool::run_chunks(uint32_t generation) {
  for (;;) {
    uint64_t v = state_.load(std::memory_order_acquire);
    if (uint32_t(v >> 32) != generation) return;
    const size_t i = size_t(v & 0xffff), chunks = size_t((v >> 16) & 0xffff);
    if (i >= chunks) return;
    if (!state_.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel)) continue;
    // The claim succeeded while this loop was current, so its fields (published before
    // state_) are the ones read here, and the caller waits for this range before it
    // writes the next loop's.
    const size_t n = job_n_.load(std::memory_order_relaxed), g = job_grain_.load(std::memory_order_relaxed);
    const size_t* bounds = job_bounds_.load(std::memory_order_relaxed);
    try {
      if (bounds)
        (*job_.load(std::memory_order_relaxed))(bounds[i], bounds[i + 1]);
      else
        (*job_.load(std::memory_order_relaxed))(i * g, std::min(n, i * g + g));
    } catch (...) {
      // Keep the first error for the caller; the other ranges still run.
      std::lock_guard lock(error_mu_);
      if (!error_) error_ = std::current_exception();
    }
    if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks) done_.notify_all();
  }
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t grain, Split split) {
  if (n == 0) return;
  const size_t T = size_t(size());
  if (grain == 0) grain = std::max<size_t>(1, (n + 4 * T - 1) / (4 * T));
  grain = std::max(grain, n / kMaxChunks + 1);  // at most kMaxChunks even ranges
  if (workers_.empty() || grain >= n) {
    fn(0, n);
    return;
  }
  size_t chunks = (n + grain - 1) / grain;
  const size_t* bounds = nullptr;
  if (split == Split::Guided) {
    // Every range but the last is at least `grain` long, so there are no more than the even
    // loop's `chunks`, within kMaxChunks.
    bounds_.assign(1, 0);
    for (size_t at = 0; at < n;) {
      const size_t share = std::max(grain, (n - at) / (2 * T) / grain * grain);
      for (size_t t = 0; t < T && at < n; ++t) bounds_.push_back(at = std::min(n, at + share));
    }
    chunks = bounds_.size() - 1;
    bounds = bounds_.data();
  }
  job_.store(&fn, std::memory_order_relaxed);
  job_bounds_.store(bounds, std::memory_order_relaxed);
  job_n_.store(n, std::memory_order_relaxed);
  job_grain_.store(grain, std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  const uint32_t g = ++generation_;
  state_.store(uint64_t(g) << 32 | uint64_t(chunks) << 16, std::memory_order_release);
  wake_.fetch_add(1, std::memory_order_release);
  wake_.notify_all();
  run_chunks(g);
  // Spin while the workers finish the ranges they took; if one has lost its core, sleep
  // until it is done instead of burning our slice.
  for (int i = 0; i < kSpin && done_.load(std::memory_order_acquire) != chunks; ++i) cpu_relax();
  for (uint32_t d; (d = done_.load(std::memory_order_acquire)) != chunks;) done_.wait(d, std::memory_order_acquire);
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void ThreadPool::worker() {
  uint32_t seen = 0;
  for (;;) {
    uint32_t w = wake_.load(std::memory_order_acquire);
    for (int i = 0; w == seen && i < kSpin; ++i) {
      cpu_relax();
      w = wake_.load(std::memory_order_acquire);
    }
    if (w == seen) {
      wake_.wait(seen, std::memory_order_acquire);
      continue;
    }
    seen = w;
    if (stop_.load()) return;
    run_chunks(uint32_t(state_.load(std::memory_order_acquire) >> 32));
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
