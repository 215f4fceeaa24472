// Helpers shared by the ISA-generic kernel templates (matmul_impl.h, ops_impl.h),
// written against a SIMD traits class S (simd_avx512.h, simd_avx2.h, simd_scalar.h).
#pragma once
#include <cstddef>
#include <cstring>

namespace vlm::kernels::detail {

// Tile loops must be fully unrolled so the accumulators live in registers; GCC at -O2
// does not always do it by itself.
#define VLM_UNROLL _Pragma("GCC unroll 32")

// The first n (< S::W) floats at p, the rest `fill`.
template <class S>
inline typename S::V load_part(const float* p, size_t n, float fill = 0.f) {
  alignas(64) float tmp[S::W];
  for (int i = 0; i < S::W; ++i) tmp[i] = fill;
  std::memcpy(tmp, p, n * 4);
  return S::load(tmp);
}

template <class S>
inline void store_part(float* p, typename S::V v, size_t n) {
  alignas(64) float tmp[S::W];
  S::store(tmp, v);
  std::memcpy(p, tmp, n * 4);
}

}  // namespace vlm::kernels::detail
