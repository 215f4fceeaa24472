#include "kernels/roofline.h"

#include <emmintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "kernels/matmul_isa.h"

namespace vlm::kernels {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Sums 16-byte words (SSE2 is baseline x86-64) with four independent chains, so the
// loop is limited by memory, not by the adds.
uint64_t stream_sum(const __m128i* p, size_t n) {
  __m128i s0 = _mm_setzero_si128(), s1 = s0, s2 = s0, s3 = s0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 = _mm_add_epi64(s0, _mm_load_si128(p + i));
    s1 = _mm_add_epi64(s1, _mm_load_si128(p + i + 1));
    s2 = _mm_add_epi64(s2, _mm_load_si128(p + i + 2));
    s3 = _mm_add_epi64(s3, _mm_load_si128(p + i + 3));
  }
  for (; i < n; ++i) s0 = _mm_add_epi64(s0, _mm_load_si128(p + i));
  const __m128i s = _mm_add_epi64(_mm_add_epi64(s0, s1), _mm_add_epi64(s2, s3));
  uint64_t out[2];
  std::memcpy(out, &s, 16);
  return out[0] + out[1];
}
}  // namespace

double measure_read_bandwidth(int threads, size_t bytes) {
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  const size_t words = std::max<size_t>(bytes / 16 / 64 * 64, 64);
  std::unique_ptr<void, Free> buf(std::aligned_alloc(64, words * 16));
  if (!buf) fail("measure_read_bandwidth: cannot allocate {} MiB", words * 16 >> 20);
  auto* p = static_cast<__m128i*>(buf.get());
  ThreadPool pool(threads);
  // Each thread touches the part it will read, so its pages are local to it.
  pool.parallel_for(words, [&](size_t b, size_t e) {
    std::memset(static_cast<void*>(p + b), 1, (e - b) * 16);
  });
  double best = 0;
  volatile uint64_t sink = 0;
  for (int pass = 0; pass < 4; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(words, [&](size_t b, size_t e) { sink = sink + stream_sum(p + b, e - b); });
    best = std::max(best, double(words * 16) / seconds_since(t0));
  }
  return best;
}

double measure_peak_flops(int threads, Isa isa) {
  const detail::IsaKernels& k = detail::kernels_for(isa);
  ThreadPool pool(threads);
  const size_t n = size_t(threads);
  // Calibrate to about 0.2 s per run.
  size_t iters = 1 << 16;
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    k.fma_loop(iters);
    if (seconds_since(t0) > 0.05) break;
    iters *= 2;
  }
  iters *= 4;
  double best = 0;
  for (int run = 0; run < 3; ++run) {
    std::atomic<double> flops{0};
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(n, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) flops.fetch_add(k.fma_loop(iters));
    });
    best = std::max(best, flops.load() / seconds_since(t0));
  }
  return best;
}

}  // namespace vlm::kernels
