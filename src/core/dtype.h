// Storage dtypes of checkpoint tensors and exact scalar conversions.
// Activations are f32; weights stay in their stored dtype: a float type or one of ggml's
// block-quantized types (docs/gguf.md §2; blocks run along a row). Q8Act and Q8KAct are not
// storage types: they are the int8 block formats the quantized dot kernels want activations in.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace vlm {

enum class DType : uint8_t {
  F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, Q8Act, Q8KAct
};

inline bool is_block_quantized(DType t) { return t != DType::F32 && t != DType::F16 && t != DType::BF16; }
// Bytes per element of a float type (block types: kernels::format_of(t).row_bytes).
inline size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }

inline std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::Q8_0: return "Q8_0";
    case DType::Q4_0: return "Q4_0";
    case DType::Q4_1: return "Q4_1";
    case DType::Q5_0: return "Q5_0";
    case DType::Q5_1: return "Q5_1";
    case DType::Q2_K: return "Q2_K";
    case DType::Q3_K: return "Q3_K";
    case DType::Q4_K: return "Q4_K";
    case DType::Q5_K: return "Q5_K";
    case DType::Q6_K: return "Q6_K";
    case DType::IQ4_NL: return "IQ4_NL";
    case DType::IQ4_XS: return "IQ4_XS";
    case DType::Q8Act: return "Q8_ACT";
    case DType::Q8KAct: return "Q8_K_ACT";
  }
  return "?";
}

inline float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t f32_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bf16_to_f32(uint16_t h) { return bits_to_f32(uint32_t(h) << 16); }

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    // zero or subnormal: man * 2^-24
    float v = float(man) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  if (exp == 31) return bits_to_f32(sign | 0x7f800000u | (man << 13));
  return bits_to_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

// Round to nearest even with overflow to inf, as IEEE conversion does.
inline uint16_t f32_to_f16(float f) {
  uint32_t u = f32_to_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return sign | 0x7e00u;
  if (u >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (u < 0x38800000u) {                         // below 2^-14: subnormal or zero
    float a = bits_to_f32(u);
    // 2^-24 units, round half to even via float add trick
    float scaled = a * 16777216.0f;  // exact: power of two
    uint32_t m = uint32_t(scaled);
    float rem = scaled - float(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return sign | uint16_t(m);
  }
  uint32_t r = u + 0xfffu + ((u >> 13) & 1u) - (112u << 23);
  return sign | uint16_t(r >> 13);
}

}  // namespace vlm
