// The CLI's edge for kernel settings: VLM_ISA=scalar|avx2|avx512 forces an ISA path
// (tests and benchmarks compare paths with it); the library itself reads no environment.
#pragma once
#include <cstdlib>

#include "core/thread_pool.h"
#include "kernels/exec.h"

namespace vlm::cli {

inline kernels::Exec exec_from_env(ThreadPool& pool, kernels::Precision precision = kernels::Precision::F32) {
  const char* isa = std::getenv("VLM_ISA");
  return kernels::Exec(pool, isa && *isa ? kernels::parse_isa(isa, "VLM_ISA") : kernels::best_isa(), precision);
}

}  // namespace vlm::cli
