// Machine limits measured at run time, so benchmarks can state their results as a
// fraction of what this machine can do (decode vs read bandwidth, encode vs FMA peak).
#pragma once
#include <cstddef>

#include "kernels/exec.h"

namespace vlm::kernels {

// Read bandwidth in bytes/s, measured the way decode reads weights: passes over 64 MiB
// windows of a `bytes` buffer (default 1 GiB, so a window is never still cached), each
// split into chunks that `threads` threads take in turn and read as one sequential stream
// with the widest loads of `isa`; best of many passes (a shared machine's load makes
// long passes unrepresentative, and the GEMV figures are best-of too).
double measure_read_bandwidth(int threads, size_t bytes = size_t(1) << 30, Isa isa = best_isa());

// Peak f32 FLOP/s (an FMA counts 2) of an ISA path: a register-resident FMA loop run on
// `threads` threads at once; best of a few runs.
double measure_peak_flops(int threads, Isa isa = best_isa());

}  // namespace vlm::kernels
