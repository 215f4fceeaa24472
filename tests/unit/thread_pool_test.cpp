#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>
#include <vector>

namespace vlm {
namespace {

TEST(ThreadPool, CoversRangeOnce) {
  ThreadPool pool(3);
  std::vector<int> hits(1001, 0);
  pool.parallel_for(hits.size(), [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) hits[i]++;
  });
  for (int h : hits) EXPECT_EQ(h, 1);
}

TEST(ThreadPool, RangeCountIsBounded) {
  ThreadPool pool(2);
  std::atomic<size_t> calls{0}, covered{0};
  const size_t n = 5 * ThreadPool::kMaxChunks + 3;
  pool.parallel_for(n, [&](size_t b, size_t e) {
    calls.fetch_add(1);
    covered.fetch_add(e - b);
  }, 1);
  EXPECT_EQ(covered.load(), n);
  EXPECT_LE(calls.load(), ThreadPool::kMaxChunks);
}

// Many short loops back to back with more threads than cores, as a decode step issues them
// on a loaded machine. Every loop must be covered exactly once, by its own function, before
// parallel_for returns. A worker that claimed a range past the end of a finished loop (it
// compared a stale index with the next loop's range count) showed here as a loop covered
// more than once, or as parallel_for never returning; the functions all stay alive, so such
// a late call is counted rather than undefined.
TEST(ThreadPool, BackToBackLoopsUnderOversubscription) {
  const int threads = 4 * int(std::max(1u, std::thread::hardware_concurrency())) + 1;
  ThreadPool pool(threads);
  constexpr size_t kLoops = 1000000;
  std::vector<std::atomic<uint32_t>> covered(kLoops);
  std::vector<std::function<void(size_t, size_t)>> fns;
  fns.reserve(kLoops);
  std::atomic<size_t> progress{0};
  std::atomic<bool> finished{false}, stuck{false};
  std::thread watchdog([&] {
    size_t last = SIZE_MAX;
    while (!finished.load()) {
      for (int i = 0; i < 100 && !finished.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (finished.load()) return;
      if (progress.load() == last) {
        stuck.store(true);
        ADD_FAILURE() << "parallel_for did not return in 10 s (loop " << last << ")";
        std::abort();  // the pool cannot be joined: end the test binary with the message above
      }
      last = progress.load();
    }
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(4);
  size_t loops = 0;
  for (; loops < kLoops && std::chrono::steady_clock::now() < deadline; ++loops) {
    const size_t n = 1 + (loops * 7919) % 37;
    std::atomic<uint32_t>* c = &covered[loops];
    fns.emplace_back([c](size_t b, size_t e) { c->fetch_add(uint32_t(e - b), std::memory_order_relaxed); });
    pool.parallel_for(n, fns.back(), 1 + loops % 3);
    ASSERT_EQ(c->load(), n) << "loop " << loops << " returned before all its ranges ran";
    progress.store(loops + 1);
  }
  finished.store(true);
  watchdog.join();
  for (size_t i = 0; i < loops; ++i)
    ASSERT_EQ(covered[i].load(), 1 + (i * 7919) % 37) << "loop " << i << " was called after it returned";
}

}  // namespace
}  // namespace vlm
