// Machine limits measured at run time, so benchmarks can state their results as a
// fraction of what this machine can do (decode vs read bandwidth, encode vs FMA peak).
#pragma once
#include <cstddef>
#include <istream>
#include <span>

#include "kernels/exec.h"

namespace vlm::kernels {

// Read bandwidth in bytes/s: passes over 64 MiB windows of a `bytes` buffer (default 1 GiB,
// so a window is never still cached) with the widest loads of `isa`, in several shapes —
// chunks that `threads` threads take in turn, each read as one sequential stream (the way
// the decode GEMV reads weights), and one share per thread read as 2, 4 or 8 interleaved
// streams (more prefetch streams in flight) — and the best pass of any shape. A limit
// that a real decoder beats is no limit: the shapes are there so that one of them reads
// at least as fast as any GEMV does (a shared machine's load makes long passes
// unrepresentative, and the GEMV figures are best-of too).
double measure_read_bandwidth(int threads, size_t bytes = size_t(1) << 30, Isa isa = best_isa());

// How fast given bytes stream from where they lie (weights mapped from the page cache, whose
// placement in memory changes their rate): each region split over `threads` threads, each
// share read as four streams in lockstep (the decode kernels' shape), region after region as a
// decode step takes its matrices; best of `passes` passes over all of them.
double measure_regions_bandwidth(std::span<const std::span<const std::byte>> regions, int threads, int passes = 2,
                                 Isa isa = best_isa());

// This process's resident KiB of the mappings that hold any of `regions`, all (Rss in
// /proc/self/smaps) and those mapped as 2 MiB pages (FilePmdMapped, or ShmemPmdMapped for a file
// on tmpfs); negative where smaps cannot be read.
struct MappedKb {
  double rss = -1, pmd = -1;
};
MappedKb mapped_kb(std::span<const std::span<const std::byte>> regions);
// The same from smaps text in that format.
MappedKb mapped_kb(std::istream& smaps, std::span<const std::span<const std::byte>> regions);

// The share of those resident pages that are 2 MiB (pmd / rss), or a negative number
// where smaps cannot be read. Such pages stream faster (docs/gguf.md, "Decode streams").
double huge_page_share(std::span<const std::span<const std::byte>> regions);

// Peak FLOP/s (a multiply-add counts 2) of an ISA path's products: a register-resident loop run
// on `threads` threads at once; best of a few runs. Fma: the f32 FMA; Dot: the AVX512-BF16 dot
// (vdpbf16ps; throws unless bf16_dot_supported()); Amx: TDPBF16PS on tiles (throws unless
// amx_supported()).
double measure_peak_flops(int threads, Isa isa = best_isa(), Bf16Gemm kernels = Bf16Gemm::Fma);

}  // namespace vlm::kernels
