// Scalar "SIMD" traits (one float per vector) for the baseline x86-64 path: the same
// tiled templates as the vector paths, portable. See simd_avx512.h.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/dtype.h"

namespace vlm::kernels::detail {
namespace {

// Scalar "vectors" of one float: the same tiled code as the SIMD paths, portable.
struct S1 {
  using V = float;
  static constexpr int W = 1, MR = 4, NV = 4;
  static constexpr int DOT_RM = 2, DOT_RN2 = 2;
  static V zero() { return 0.f; }
  static V load(const float* p) { return *p; }
  static void store(float* p, V v) { *p = v; }
  static V bcast(const float* p) { return *p; }
  static V fma(V a, V b, V c) { return a * b + c; }
  static V add(V a, V b) { return a + b; }
  static float hsum(V v) { return v; }
  static V load_bf16(const uint16_t* p) { return bf16_to_f32(*p); }
  static V load_f16(const uint16_t* p) { return f16_to_f32(*p); }
  static void transpose(V*) {}
  // ---- element-wise ops (ops_impl.h) ----
  using M = bool;
  static V set1(float v) { return v; }
  static V sub(V a, V b) { return a - b; }
  static V mul(V a, V b) { return a * b; }
  static V div(V a, V b) { return a / b; }
  static V max(V a, V b) { return a > b ? a : b; }
  static V min(V a, V b) { return a < b ? a : b; }
  static V abs(V a) { return std::fabs(a); }
  static float hmax(V v) { return v; }
  static V copysign(V mag, V sign) { return std::copysign(mag, sign); }
  static M lt(V a, V b) { return a < b; }
  static V select(M m, V a, V b) { return m ? a : b; }
  static V round(V a) { return std::nearbyint(a); }
  static V times_pow2(V p, V n) { return p * bits_to_f32(uint32_t(int32_t(n) + 127) << 23); }
  static V round_bf16(V v) { return vlm::round_bf16(v); }
  static void store_bf16(uint16_t* p, V rounded) { *p = uint16_t(f32_to_bits(rounded) >> 16); }
};
}  // namespace
}  // namespace vlm::kernels::detail
