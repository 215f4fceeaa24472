// A small fixed pool for data-parallel loops (kernels split rows across it).
// Work is handed out in chunks that threads take from a shared counter, so a thread
// that is slowed (another process, a busier memory channel) takes fewer chunks and all
// threads finish a loop together. Idle workers spin briefly between loops (decode issues
// hundreds of short loops per token) and then sleep.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace vlm {

class ThreadPool {
 public:
  // n_threads counts the calling thread: ThreadPool(1) runs everything inline. Throws
  // vlm::Error when n_threads is above max_threads() or a thread cannot be started
  // (the threads already started are joined first).
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }

  static constexpr size_t kMaxChunks = 0xffff;  // ranges per loop: they fit a 16-bit field of state_

  // The most threads a pool accepts: 4× the hardware concurrency, at least 256.
  static int max_threads();

  // How a loop's ranges are cut. Even: every range `grain` long (the last may be shorter).
  // Guided: ranges shrink as the loop goes (OpenMP's schedule(guided)): each round gives every
  // thread a range of 1 / (2 × threads) of what is left, a multiple of `grain` and at least
  // `grain`, so the thread that finishes first waits at most one short range for the others.
  // Even ranges of 1/8 of a decode product kept one of two threads idle for 11 % of each
  // product's time (docs/performance.md, "Guided ranges").
  enum class Split { Even, Guided };

  // Calls fn(begin, end) over disjoint ranges covering [0, n) and waits. Ranges are cut as
  // `split` says, from `grain` (longer where n / grain would exceed kMaxChunks; grain 0 picks
  // about 4 even ranges per thread).
  // fn may be called several times on one thread, and from any thread of the pool; the
  // first exception it throws is rethrown here once every thread has left the loop.
  void parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t grain = 0,
                    Split split = Split::Even);

 private:
  void worker();
  void run_chunks(uint32_t generation);
  void shutdown();  // stops and joins the workers

  std::vector<std::thread> workers_;
  // The current loop. A range is claimed by a compare-exchange on state_, which holds the
  // generation (high 32 bits), the loop's range count and the next range index (16 bits
  // each), so a worker that wakes after the others have finished a loop claims nothing, and
  // the caller never waits for a thread that has not started a range (on a machine with more
  // runnable threads than cores, a descheduled worker would otherwise stall every loop).
  // The count is in the same word as the index: a worker that read a finished loop's state
  // must not compare its index with the next loop's count, or it claims a range past the
  // end of the finished loop while the caller is writing the next one's fields (seen: the
  // done_ count then skips the caller's target and the caller waits forever).
  std::atomic<const std::function<void(size_t, size_t)>*> job_{nullptr};
  std::atomic<size_t> job_n_{0}, job_grain_{1};
  // A guided loop's range bounds (range i is [bounds_[i], bounds_[i + 1])), written by the caller
  // before it publishes state_; null for an even loop. The vector keeps its capacity, so a
  // steady run of loops allocates nothing.
  std::atomic<const size_t*> job_bounds_{nullptr};
  std::vector<size_t> bounds_;
  std::atomic<uint64_t> state_{0};
  // 32 bits: a futex-sized atomic, so wait/notify are direct futex calls (libstdc++ 12 routes
  // wider types through a shared proxy, where a notify can be lost).
  std::atomic<uint32_t> done_{0};   // ranges finished in the current loop
  std::atomic<uint32_t> wake_{0};   // bumped per loop; idle workers wait on it
  uint32_t generation_ = 0;         // the caller's loop counter
  std::atomic<bool> stop_{false};
  std::mutex error_mu_;
  std::exception_ptr error_;  // first exception thrown by fn in the current loop
};

// Default thread count: VLM_THREADS if set, else the hardware concurrency.
int default_threads();

}  // namespace vlm
