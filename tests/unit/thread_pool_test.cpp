#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <mutex>
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

// Guided ranges cover the loop once, shrink from 1 / (2 × threads) of the loop down to the
// grain, and stay whole multiples of it (the decode products' 64-row streams).
TEST(ThreadPool, GuidedRangesShrinkToTheGrain) {
  for (size_t n : {size_t(1), size_t(63), size_t(64), size_t(1000), size_t(10240), size_t(262208)}) {
    ThreadPool pool(3);
    std::mutex mu;
    std::vector<std::pair<size_t, size_t>> ranges;
    pool.parallel_for(n, [&](size_t b, size_t e) {
      std::lock_guard lock(mu);
      ranges.emplace_back(b, e);
    }, 64, ThreadPool::Split::Guided);
    std::sort(ranges.begin(), ranges.end());
    size_t at = 0;
    for (size_t i = 0; i < ranges.size(); ++i) {
      const auto [b, e] = ranges[i];
      EXPECT_EQ(b, at) << "n " << n;
      EXPECT_LT(b, e) << "n " << n;
      if (e < n) EXPECT_EQ((e - b) % 64, 0u) << "n " << n << " range " << i;
      if (i > 0 && e < n) EXPECT_LE(e - b, ranges[i - 1].second - ranges[i - 1].first) << "n " << n;
      at = e;
    }
    EXPECT_EQ(at, n);
    if (n >= 6 * 64) {
      EXPECT_LE(ranges[0].second, n / 6) << "n " << n;  // a first range of at most 1 / (2 × 3)
      EXPECT_LE(ranges.back().second - ranges.back().first, 64u) << "n " << n;
      // About three ranges per halving of the rest (even ranges of 64 would be n / 64).
      EXPECT_LE(ranges.size(), 3 * (size_t(std::log2(double(n) / 64)) + 3)) << "n " << n;
    }
  }
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
