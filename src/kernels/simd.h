// Helpers shared by the ISA-generic kernel templates (matmul_impl.h, ops_impl.h),
// written against a SIMD traits class S (simd_avx512.h, simd_avx2.h, simd_scalar.h).
#pragma once
#include <cstddef>
#include <cstring>

namespace vlm::kernels::detail {

// Tile loops must be fully unrolled so the accumulators live in registers; GCC at -O2
// does not always do it by itself.
#define VLM_UNROLL _Pragma("GCC unroll 32")

// The first n (< S::W) floats at p, the rest `fill`. Traits with masked loads and stores
// (S::load_first: AVX-512 and AVX2; S::store_first: AVX-512) use them; elsewhere the floats go
// through a buffer on the stack. A vector load from that buffer waits for the copy's narrower
// stores to retire (a failed store-to-load forward: 9 % of the samples of the vision tower's P·v,
// whose 72 columns end in a partial vector, on an Intel Xeon; docs/performance.md, "Masked tails").
template <class S>
inline typename S::V load_part(const float* p, size_t n, float fill = 0.f) {
  if constexpr (requires { S::load_first(p, n, fill); }) {
    return S::load_first(p, n, fill);
  } else {
    alignas(64) float tmp[S::W];
    for (int i = 0; i < S::W; ++i) tmp[i] = fill;
    std::memcpy(tmp, p, n * 4);
    return S::load(tmp);
  }
}

template <class S>
inline void store_part(float* p, typename S::V v, size_t n) {
  if constexpr (requires { S::store_first(p, v, n); }) {
    S::store_first(p, v, n);
  } else {
    alignas(64) float tmp[S::W];
    S::store(tmp, v);
    std::memcpy(p, tmp, n * 4);
  }
}

}  // namespace vlm::kernels::detail
