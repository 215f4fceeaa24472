#include "kernels/roofline.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "kernels/matmul_isa.h"

namespace vlm::kernels {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

MappedKb mapped_kb(std::span<const std::span<const std::byte>> regions) {
  std::ifstream f("/proc/self/smaps");
  if (!f) return {};
  return mapped_kb(f, regions);
}

MappedKb mapped_kb(std::istream& f, std::span<const std::span<const std::byte>> regions) {
  // Each mapping is a range line ("begin-end perms ...") followed by "Key: N kB" lines.
  bool holds = false;
  MappedKb kb{0, 0};
  std::string line;
  while (std::getline(f, line)) {
    unsigned long b = 0, e = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &b, &e) == 2) {
      holds = std::any_of(regions.begin(), regions.end(), [&](const auto& r) {
        const auto p = reinterpret_cast<uintptr_t>(r.data());
        return p < e && p + r.size() > b;
      });
      continue;
    }
    if (!holds) continue;
    auto value_of = [&](std::string_view key) {  // N of "key N kB", 0 on another key's line
      double n = 0;
      return line.starts_with(key) && std::sscanf(line.c_str() + key.size(), "%lf", &n) == 1 ? n : 0.0;
    };
    kb.rss += value_of("Rss:");
    // A file on tmpfs or shmem counts its 2 MiB pages as ShmemPmdMapped, any other as FilePmdMapped.
    kb.pmd += value_of("FilePmdMapped:") + value_of("ShmemPmdMapped:");
  }
  return kb;
}

double huge_page_share(std::span<const std::span<const std::byte>> regions) {
  const MappedKb kb = mapped_kb(regions);
  return kb.rss < 0 ? -1 : kb.rss > 0 ? kb.pmd / kb.rss : 0;
}

double measure_read_bandwidth(int threads, size_t bytes, Isa isa) {
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  constexpr size_t kWindow = size_t(64) << 20;
  const size_t windows = std::max<size_t>(bytes / kWindow, 2), floats = kWindow / 4;
  std::unique_ptr<void, Free> buf(std::aligned_alloc(64, windows * kWindow));
  if (!buf) fail("measure_read_bandwidth: cannot allocate {} MiB", windows * kWindow >> 20);
  auto* p = static_cast<float*>(buf.get());
  const detail::IsaKernels& k = detail::kernels_for(isa);
  ThreadPool pool(threads);
  // Small positive floats: the sums stay normal numbers.
  pool.parallel_for(windows * floats, [&](size_t b, size_t e) {
    std::memset(static_cast<void*>(p + b), 1, (e - b) * 4);
  });
  const size_t grain = floats / (4 * size_t(threads));
  const size_t share = floats / size_t(threads);
  double best = 0;
  std::atomic<float> sink{0};
  // One stream per chunk (chunks taken from a shared counter), then 2, 4 and 8 streams per
  // thread in lockstep, the shape of the decode kernels (docs/gguf.md, "Decode streams"):
  // the best of them is the limit a decoder is held to.
  for (size_t streams : {1, 2, 4, 8}) {
    for (size_t pass = 0; pass < 2 * windows; ++pass) {
      const float* w = p + (pass % windows) * floats;
      const auto t0 = std::chrono::steady_clock::now();
      if (streams == 1) {
        pool.parallel_for(floats, [&](size_t b, size_t e) { sink = sink + k.read_loop(w + b, e - b, 1, 0); }, grain);
      } else {
        pool.parallel_for(size_t(threads), [&](size_t i0, size_t i1) {
          float s = 0;
          for (size_t t = i0; t < i1; ++t) s += k.read_loop(w + t * share, share / streams, streams, share / streams);
          sink = sink + s;
        });
      }
      best = std::max(best, double(kWindow) / seconds_since(t0));
    }
  }
  return best;
}

double measure_regions_bandwidth(std::span<const std::span<const std::byte>> regions, int threads, int passes,
                                 Isa isa) {
  const detail::IsaKernels& k = detail::kernels_for(isa);
  ThreadPool pool(threads);
  constexpr size_t kStreams = 4, kPiece = 256 * kStreams;  // read_loop reads 256 bytes a turn per stream
  std::atomic<float> sink{0};
  double best = 0;
  for (int pass = 0; pass < passes; ++pass) {
    double bytes = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto& r : regions) {
      // From the first 64-byte boundary: the loads are whole lines, as the kernels' are. The bytes
      // are summed as f32 whatever they hold (NaN included): only the reading is timed.
      const auto* p = r.data() + (64 - reinterpret_cast<uintptr_t>(r.data()) % 64) % 64;
      const size_t n = r.size() < size_t(p - r.data()) ? 0 : r.size() - size_t(p - r.data());
      const size_t share = n / size_t(threads) / kPiece * kPiece;
      if (share == 0) continue;
      bytes += double(share) * threads;
      pool.parallel_for(size_t(threads), [&](size_t b, size_t e) {
        float s = 0;
        for (size_t t = b; t < e; ++t) {
          const auto* f = reinterpret_cast<const float*>(p + t * share);
          s += k.read_loop(f, share / 4 / kStreams, kStreams, share / 4 / kStreams);
        }
        sink = sink + s;
      });
    }
    best = std::max(best, bytes / seconds_since(t0));
  }
  return best;
}

double measure_peak_flops(int threads, Isa isa, Bf16Gemm kernels) {
  if (kernels == Bf16Gemm::Dot && !bf16_dot_supported()) fail("measure_peak_flops: this CPU has no AVX512-BF16 dot");
  if (kernels == Bf16Gemm::Amx && !amx_supported()) fail("measure_peak_flops: this CPU gives this process no AMX tiles");
  double (*loop)(size_t) = kernels == Bf16Gemm::Dot   ? &detail::bf16_dot_loop
                           : kernels == Bf16Gemm::Amx ? &detail::amx_loop
                                                      : detail::kernels_for(isa).fma_loop;
  ThreadPool pool(threads);
  const size_t n = size_t(threads);
  // Calibrate to about 0.1 s per run. The best of 8 short runs: on a shared machine another
  // tenant takes a core for a second at a time, and 3 runs of 0.2 s read half the peak.
  size_t iters = 1 << 16;
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    loop(iters);
    if (seconds_since(t0) > 0.05) break;
    iters *= 2;
  }
  iters *= 2;
  double best = 0;
  for (int run = 0; run < 8; ++run) {
    std::atomic<double> flops{0};
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(n, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) flops.fetch_add(loop(iters));
    });
    best = std::max(best, flops.load() / seconds_since(t0));
  }
  return best;
}

}  // namespace vlm::kernels
