// Machine limits measured at run time, so benchmarks can state their results as a
// fraction of what this machine can do (decode vs read bandwidth, encode vs FMA peak).
#pragma once
#include <cstddef>

#include "kernels/exec.h"

namespace vlm::kernels {

// Read bandwidth in bytes/s: `threads` threads each stream their share of a buffer of
// `bytes` (default 1 GiB, far beyond the caches); best of a few passes.
double measure_read_bandwidth(int threads, size_t bytes = size_t(1) << 30);

// Peak f32 FLOP/s (an FMA counts 2) of an ISA path: a register-resident FMA loop run on
// `threads` threads at once; best of a few runs.
double measure_peak_flops(int threads, Isa isa = best_isa());

}  // namespace vlm::kernels
