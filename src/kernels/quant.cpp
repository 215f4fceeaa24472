#include "kernels/quant.h"

#include <cpuid.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/matmul_isa.h"
#include "kernels/quant_blocks.h"

namespace vlm::kernels {

using namespace quant_blocks;

size_t quant_row_bytes(GgmlType t, size_t cols) {
  const GgmlTypeTraits tr = ggml_traits(t);
  if (cols % size_t(tr.block_elems) != 0)
    fail("quant: row of {} values is not a whole number of {} blocks ({})", cols, ggml_type_name(t), tr.block_elems);
  return cols / size_t(tr.block_elems) * tr.block_bytes;
}

namespace {
// Q4_K and Q5_K (ggml's dequantize_row_q4_K / _q5_K): value l of sub-block j is d·sc_j·q − dmin·m_j.
template <class Block>
void dequantize_k4(const std::byte* src, size_t nb, float* y) {
  for (size_t i = 0; i < nb; ++i) {
    const auto* b = reinterpret_cast<const Block*>(src) + i;
    const float d = f16_to_f32(b->d), dmin = f16_to_f32(b->dmin);
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      scale_min_k4(j, b->scales, sc, m);
      const float dj = d * float(sc), mj = dmin * float(m);
      for (int l = 0; l < 32; ++l) {
        const float p = dj * float(k4_code(b, j, l));
        *y++ = p - mj;
      }
    }
  }
}
// Q4_1 and Q5_1 (ggml's dequantize_row_q4_1 / _q5_1): value j is q·d + m.
template <class Block>
void dequantize_min32(const std::byte* src, size_t nb, float* y) {
  for (size_t i = 0; i < nb; ++i, y += 32) {
    const auto* b = reinterpret_cast<const Block*>(src) + i;
    const float d = f16_to_f32(b->d), m = f16_to_f32(b->m);
    for (int j = 0; j < 32; ++j) {
      const float p = float(q45_code(b, j)) * d;
      y[j] = p + m;
    }
  }
}
}  // namespace

// Each loop follows ggml-quants.c dequantize_row_* operation for operation; products that
// ggml writes as one expression are kept in separate statements where a compiler could
// otherwise contract them into an FMA and change the rounding.
void dequantize_row(GgmlType t, const std::byte* src, float* y, size_t n) {
  const size_t nb = n / size_t(ggml_traits(t).block_elems);
  switch (t) {
    case GgmlType::F32:
      std::memcpy(y, src, n * 4);
      return;
    case GgmlType::F16:
      for (size_t i = 0; i < n; ++i) y[i] = f16_to_f32(load_u16(src + 2 * i));
      return;
    case GgmlType::BF16:
      for (size_t i = 0; i < n; ++i) y[i] = bf16_to_f32(load_u16(src + 2 * i));
      return;
    case GgmlType::Q8_0:
      for (size_t i = 0; i < nb; ++i, y += 32) {
        const auto* b = reinterpret_cast<const BlockQ8_0*>(src) + i;
        const float d = f16_to_f32(b->d);
        for (int j = 0; j < 32; ++j) y[j] = float(b->qs[j]) * d;
      }
      return;
    case GgmlType::Q4_0:
      for (size_t i = 0; i < nb; ++i, y += 32) {
        const auto* b = reinterpret_cast<const BlockQ4_0*>(src) + i;
        const float d = f16_to_f32(b->d);
        for (int j = 0; j < 16; ++j) {
          y[j] = float((b->qs[j] & 0x0F) - 8) * d;
          y[j + 16] = float((b->qs[j] >> 4) - 8) * d;
        }
      }
      return;
    case GgmlType::Q4_1: return dequantize_min32<BlockQ4_1>(src, nb, y);
    case GgmlType::Q5_0:
      for (size_t i = 0; i < nb; ++i, y += 32) {
        const auto* b = reinterpret_cast<const BlockQ5_0*>(src) + i;
        const float d = f16_to_f32(b->d);
        for (int j = 0; j < 32; ++j) y[j] = float(q45_code(b, j) - 16) * d;
      }
      return;
    case GgmlType::Q5_1: return dequantize_min32<BlockQ5_1>(src, nb, y);
    case GgmlType::IQ4_NL:
      for (size_t i = 0; i < nb; ++i, y += 32) {
        const auto* b = reinterpret_cast<const BlockIQ4_NL*>(src) + i;
        const float d = f16_to_f32(b->d);
        for (int j = 0; j < 32; ++j) y[j] = d * float(kIq4Values[nibble32(b->qs, j)]);
      }
      return;
    case GgmlType::IQ4_XS:
      for (size_t i = 0; i < nb; ++i) {
        const auto* b = reinterpret_cast<const BlockIQ4_XS*>(src) + i;
        const float d = f16_to_f32(b->d);
        for (int j = 0; j < 8; ++j, y += 32) {
          const float dl = d * float(iq4_xs_scale(b, j));
          for (int l = 0; l < 32; ++l) y[l] = dl * float(kIq4Values[nibble32(b->qs + 16 * j, l)]);
        }
      }
      return;
    case GgmlType::Q2_K:
      for (size_t i = 0; i < nb; ++i, y += 256) {
        const auto* b = reinterpret_cast<const BlockQ2_K*>(src) + i;
        const float d = f16_to_f32(b->d), dmin = f16_to_f32(b->dmin);
        for (int j = 0; j < 16; ++j) {
          const float dl = d * float(b->scales[j] & 0xF), ml = dmin * float(b->scales[j] >> 4);
          for (int l = 0; l < 16; ++l) {
            const float p = dl * float(q2_code(b->qs, 16 * j + l));
            y[16 * j + l] = p - ml;
          }
        }
      }
      return;
    case GgmlType::Q3_K:
      for (size_t i = 0; i < nb; ++i, y += 256) {
        const auto* b = reinterpret_cast<const BlockQ3_K*>(src) + i;
        const float d = f16_to_f32(b->d);
        uint8_t sc[16];
        q3_k_scales(b->scales, sc);
        for (int j = 0; j < 16; ++j) {
          const float dl = d * float(sc[j] - 32);
          for (int l = 0; l < 16; ++l) y[16 * j + l] = dl * float(q3_code(b, 16 * j + l) - 4);
        }
      }
      return;
    case GgmlType::Q4_K: return dequantize_k4<BlockQ4_K>(src, nb, y);
    case GgmlType::Q5_K: return dequantize_k4<BlockQ5_K>(src, nb, y);
    case GgmlType::Q6_K:
      for (size_t i = 0; i < nb; ++i) {
        const auto* b = reinterpret_cast<const BlockQ6_K*>(src) + i;
        const float d = f16_to_f32(b->d);
        const uint8_t* ql = b->ql;
        const uint8_t* qh = b->qh;
        const int8_t* sc = b->scales;
        for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
          for (int l = 0; l < 32; ++l) {
            const int is = l / 16;
            const int q1 = int((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int q2 = int((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = int((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = int((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * float(sc[is + 0]) * float(q1);
            y[l + 32] = d * float(sc[is + 2]) * float(q2);
            y[l + 64] = d * float(sc[is + 4]) * float(q3);
            y[l + 96] = d * float(sc[is + 6]) * float(q4);
          }
        }
      }
      return;
  }
}

namespace {

void store_u16(std::byte* p, uint16_t v) { std::memcpy(p, &v, 2); }

// The value of largest magnitude of n, sign kept (the first of equals).
float signed_max(const float* x, int n) {
  float amax = 0, mx = 0;
  for (int j = 0; j < n; ++j)
    if (amax < std::fabs(x[j])) amax = std::fabs(x[j]), mx = x[j];
  return mx;
}

// Q4_1, Q5_0 and Q5_1 as ggml's quantize_row_q4_1_ref / _q5_0_ref / _q5_1_ref: Q5_0 maps the
// value of largest magnitude, sign kept, to −16 (codes truncated from x/d + 16.5); Q4_1 and Q5_1
// span [min, max] in 15 or 31 steps (codes truncated from (x − min)/d + 0.5). The nibbles go as
// Q4_0's, the fifth bits to qh.
template <class Block>
void q45_block(const float* x, std::byte* out) {
  constexpr bool offset = !std::is_same_v<Block, BlockQ5_0>, fifth = requires(Block b) { b.qh; };
  constexpr int top = fifth ? 31 : 15;
  auto* b = reinterpret_cast<Block*>(out);
  float d, lo = 0;
  if constexpr (offset) {
    float hi = x[0];
    lo = x[0];
    for (int j = 0; j < 32; ++j) lo = std::min(lo, x[j]), hi = std::max(hi, x[j]);
    d = (hi - lo) / float(top);
    b->m = f32_to_f16(lo);
  } else {
    d = signed_max(x, 32) / -16.0f;
  }
  b->d = f32_to_f16(d);
  const float id = d != 0 ? 1.0f / d : 0.0f;
  uint32_t qh = 0;
  int q[32];
  for (int j = 0; j < 32; ++j) {
    if constexpr (offset) q[j] = std::min(top, int(uint8_t((x[j] - lo) * id + 0.5f)));
    else q[j] = std::min(31, int(int8_t(x[j] * id + 16.5f)));
    qh |= uint32_t((q[j] >> 4) & 1) << j;
  }
  for (int j = 0; j < 16; ++j) b->qs[j] = uint8_t((q[j] & 0x0F) | (q[j + 16] & 0x0F) << 4);
  if constexpr (fifth) std::memcpy(b->qh, &qh, 4);
}

// The K-quants with a min (Q2_K, Q4_K, Q5_K): each of `n` sub-blocks of `len` values gets scale
// (max − min)/top and offset −min (min ≤ 0), stored as codes 0..`steps` against the
// super-block's f16 d and dmin. Value l of sub-block j then takes code
// round((x + dmin·m_j)/(d·sc_j)) in 0..top (code()).
struct AffineScales {
  uint16_t d, dmin;  // f16
  uint8_t sc[16], m[16];
  float step[16], offset[16];
  int top;
  int code(int j, float x) const {
    return step[j] > 0 ? int(std::clamp(std::nearbyint((x + offset[j]) / step[j]), 0.0f, float(top))) : 0;
  }
};
AffineScales fit_affine(const float* x, int n, int len, int top, int steps) {
  AffineScales a{};
  a.top = top;
  float scale[16], mins[16], smax = 0, mmax = 0;
  for (int j = 0; j < n; ++j) {
    float lo = 0, hi = x[len * j];
    for (int l = 0; l < len; ++l) lo = std::min(lo, x[len * j + l]), hi = std::max(hi, x[len * j + l]);
    scale[j] = (hi - lo) / float(top);
    mins[j] = -lo;
    smax = std::max(smax, scale[j]);
    mmax = std::max(mmax, mins[j]);
  }
  a.d = f32_to_f16(smax / float(steps));
  a.dmin = f32_to_f16(mmax / float(steps));
  const float d = f16_to_f32(a.d), dmin = f16_to_f32(a.dmin);
  for (int j = 0; j < n; ++j) {
    a.sc[j] = d > 0 ? uint8_t(std::clamp(std::nearbyint(scale[j] / d), 0.0f, float(steps))) : 0;
    a.m[j] = dmin > 0 ? uint8_t(std::clamp(std::nearbyint(mins[j] / dmin), 0.0f, float(steps))) : 0;
    a.step[j] = d * float(a.sc[j]);
    a.offset[j] = dmin * float(a.m[j]);
  }
  return a;
}

// Q4_K and Q5_K: sub-blocks of 32, codes to 15 (Q5_K: 31), 6-bit scales and mins.
template <class Block>
void k4_block(const float* x, std::byte* out) {
  constexpr bool five = requires(Block b) { b.qh; };
  auto* b = reinterpret_cast<Block*>(out);
  const AffineScales a = fit_affine(x, 8, 32, five ? 31 : 15, 63);
  b->d = a.d;
  b->dmin = a.dmin;
  const uint8_t* sc = a.sc;
  const uint8_t* m = a.m;
  for (int j = 0; j < 4; ++j) {
    b->scales[j] = uint8_t((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    b->scales[j + 4] = uint8_t((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    b->scales[j + 8] = uint8_t((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
  }
  if constexpr (five) std::memset(b->qh, 0, sizeof b->qh);
  for (int j = 0; j < 8; ++j) {
    for (int l = 0; l < 32; ++l) {
      const int q = a.code(j, x[32 * j + l]);
      uint8_t& byte = b->qs[32 * (j / 2) + l];
      byte = (j & 1) ? uint8_t((byte & 0x0F) | ((q & 15) << 4)) : uint8_t(q & 15);
      if constexpr (five) b->qh[l] = uint8_t(b->qh[l] | ((q >> 4) << j));
    }
  }
}

// Value e's two low code bits into a Q2_K or Q3_K block's qs (q2_code's layout).
void put_q2(uint8_t* qs, int e, int q) { qs[32 * (e / 128) + e % 32] |= uint8_t((q & 3) << 2 * (e % 128 / 32)); }

// Q2_K: sub-blocks of 16, codes to 3, 4-bit scales and mins.
void q2_k_block(const float* x, std::byte* out) {
  auto* b = reinterpret_cast<BlockQ2_K*>(out);
  const AffineScales a = fit_affine(x, 16, 16, 3, 15);
  b->d = a.d;
  b->dmin = a.dmin;
  for (int j = 0; j < 16; ++j) b->scales[j] = uint8_t(a.sc[j] | a.m[j] << 4);
  std::memset(b->qs, 0, sizeof b->qs);
  for (int e = 0; e < 256; ++e) put_q2(b->qs, e, a.code(e / 16, x[e]));
}

// The K-quants with signed sub-block scales (Q3_K, IQ4_XS): each of `n` sub-blocks of `len`
// values maps its value of largest magnitude, sign kept, to −top; those scales are stored as
// signed 6-bit multiples l_j (−32..31) of the super-block's f16 d = max/31.
struct SignedScales {
  uint16_t d;  // f16
  int l[16];
};
SignedScales fit_signed(const float* x, int n, int len, float top) {
  SignedScales a{};
  float s[16], smax = 0;
  for (int j = 0; j < n; ++j) s[j] = signed_max(x + len * j, len) / -top, smax = std::max(smax, std::fabs(s[j]));
  a.d = f32_to_f16(smax / 31.0f);
  const float d = f16_to_f32(a.d);
  for (int j = 0; j < n; ++j) a.l[j] = d > 0 ? int(std::clamp(std::nearbyint(s[j] / d), -32.0f, 31.0f)) : 0;
  return a;
}

// Q3_K: sub-blocks of 16 mapped to −4 (fit_signed).
void q3_k_block(const float* x, std::byte* out) {
  auto* b = reinterpret_cast<BlockQ3_K*>(out);
  const SignedScales a = fit_signed(x, 16, 16, 4.0f);
  b->d = a.d;
  const float d = f16_to_f32(b->d);
  std::memset(b->scales, 0, sizeof b->scales);
  std::memset(b->hmask, 0, sizeof b->hmask);
  std::memset(b->qs, 0, sizeof b->qs);
  for (int j = 0; j < 16; ++j) {
    const int l = a.l[j], sc = l + 32;
    // q3_k_scales' layout: low nibble j / 8 of byte j % 8, top bits 2·(j / 4) of byte 8 + j % 4
    b->scales[j % 8] = uint8_t(b->scales[j % 8] | (sc & 15) << 4 * (j / 8));
    b->scales[8 + j % 4] = uint8_t(b->scales[8 + j % 4] | (sc >> 4) << 2 * (j / 4));
    const float e = d * float(l);
    for (int i = 0; i < 16; ++i) {
      const int v = 16 * j + i;
      const int q = (e != 0 ? int(std::clamp(std::nearbyint(x[v] / e), -4.0f, 3.0f)) : 0) + 4;
      put_q2(b->qs, v, q);
      b->hmask[v % 32] = uint8_t(b->hmask[v % 32] | (q >> 2) << (v / 32));
    }
  }
}

// The codes of 32 values x against scale e (value ≈ e · kIq4Values[code]), the nearest codebook
// entry each, packed as Q4_0's nibbles.
void iq4_codes(const float* x, float e, uint8_t* qs) {
  int q[32];
  for (int j = 0; j < 32; ++j) {
    // The nearest entry (the lower one at a tie): the codebook ascends, so it is the first entry
    // not below t or the one before it.
    const float t = e != 0 ? x[j] / e : 0.0f;
    const int i = int(std::lower_bound(kIq4Values, kIq4Values + 16, t, [](int8_t v, float u) { return float(v) < u; }) -
                      kIq4Values);
    q[j] = i == 16 ? 15 : i == 0 ? 0 : std::fabs(t - float(kIq4Values[i - 1])) <= std::fabs(t - float(kIq4Values[i])) ? i - 1 : i;
  }
  for (int j = 0; j < 16; ++j) qs[j] = uint8_t(q[j] | q[j + 16] << 4);
}

// IQ4_NL: the value of largest magnitude maps to the codebook's −127 (not ggml's search over
// nearby scales: valid blocks, a little more error); IQ4_XS: each sub-block's scale so, rounded
// to a signed 6-bit multiple of the super-block's f16 d (fit_signed).
void iq4_nl_block(const float* x, std::byte* out) {
  auto* b = reinterpret_cast<BlockIQ4_NL*>(out);
  b->d = f32_to_f16(signed_max(x, 32) / -127.0f);
  iq4_codes(x, f16_to_f32(b->d), b->qs);
}

void iq4_xs_block(const float* x, std::byte* out) {
  auto* b = reinterpret_cast<BlockIQ4_XS*>(out);
  const SignedScales a = fit_signed(x, 8, 32, 127.0f);
  b->d = a.d;
  const float d = f16_to_f32(b->d);
  b->scales_h = 0;
  std::memset(b->scales_l, 0, sizeof b->scales_l);
  for (int j = 0; j < 8; ++j) {
    const int l = a.l[j], ls = l + 32;
    b->scales_l[j / 2] = uint8_t(b->scales_l[j / 2] | (ls & 15) << 4 * (j % 2));
    b->scales_h = uint16_t(b->scales_h | (ls >> 4) << 2 * j);
    iq4_codes(x + 32 * j, d * float(l), b->qs + 16 * j);
  }
}

void q6_k_block(const float* x, std::byte* out) {
  auto* b = reinterpret_cast<BlockQ6_K*>(out);
  float scale[16], smax = 0;
  for (int j = 0; j < 16; ++j) {
    float amax = 0;
    for (int l = 0; l < 16; ++l) amax = std::max(amax, std::fabs(x[16 * j + l]));
    scale[j] = amax / 31.0f;
    smax = std::max(smax, scale[j]);
  }
  b->d = f32_to_f16(smax / 127.0f);
  const float d = f16_to_f32(b->d);
  for (int j = 0; j < 16; ++j) b->scales[j] = d > 0 ? int8_t(std::clamp(std::nearbyint(scale[j] / d), -128.0f, 127.0f)) : 0;
  std::memset(b->ql, 0, sizeof b->ql);
  std::memset(b->qh, 0, sizeof b->qh);
  for (int e = 0; e < 256; ++e) {
    const float ed = d * float(b->scales[e / 16]);
    const int q = (ed != 0 ? int(std::clamp(std::nearbyint(x[e] / ed), -32.0f, 31.0f)) : 0) + 32;
    // value l + 32k of half h: low 4 bits in ql (k odd: +32; k ≥ 2: high nibble), high 2 bits in qh[l] at 2k
    const int half = e / 128, k = (e % 128) / 32, l = e % 32;
    uint8_t& lo = b->ql[64 * half + l + 32 * (k & 1)];
    lo = uint8_t(lo | ((q & 15) << (k < 2 ? 0 : 4)));
    b->qh[32 * half + l] = uint8_t(b->qh[32 * half + l] | ((q >> 4) << (2 * k)));
  }
}

}  // namespace

void quantize_row(GgmlType t, const float* x, std::byte* dst, size_t n) {
  const size_t be = size_t(ggml_traits(t).block_elems), bb = ggml_traits(t).block_bytes;
  if (n % be) fail("quantize: {} values are not whole {} blocks of {}", n, ggml_type_name(t), be);
  for (size_t i = 0; i < n / be; ++i, x += be, dst += bb) {
    switch (t) {
      case GgmlType::F32: std::memcpy(dst, x, 4); break;
      case GgmlType::F16: store_u16(dst, f32_to_f16(x[0])); break;
      case GgmlType::BF16: store_u16(dst, f32_to_bf16(x[0])); break;
      case GgmlType::Q8_0: {
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
        const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        store_u16(dst, f32_to_f16(d));
        for (int j = 0; j < 32; ++j) dst[2 + j] = std::byte(uint8_t(int8_t(std::round(x[j] * id))));
        break;
      }
      case GgmlType::Q4_0: {
        const float d = signed_max(x, 32) / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
        store_u16(dst, f32_to_f16(d));
        for (int j = 0; j < 16; ++j) {
          const int a = std::min(15, int(int8_t(x[j] * id + 8.5f))), b = std::min(15, int(int8_t(x[j + 16] * id + 8.5f)));
          dst[2 + j] = std::byte(uint8_t(a | (b << 4)));
        }
        break;
      }
      case GgmlType::Q4_1: q45_block<BlockQ4_1>(x, dst); break;
      case GgmlType::Q5_0: q45_block<BlockQ5_0>(x, dst); break;
      case GgmlType::Q5_1: q45_block<BlockQ5_1>(x, dst); break;
      case GgmlType::Q2_K: q2_k_block(x, dst); break;
      case GgmlType::Q3_K: q3_k_block(x, dst); break;
      case GgmlType::Q4_K: k4_block<BlockQ4_K>(x, dst); break;
      case GgmlType::Q5_K: k4_block<BlockQ5_K>(x, dst); break;
      case GgmlType::Q6_K: q6_k_block(x, dst); break;
      case GgmlType::IQ4_NL: iq4_nl_block(x, dst); break;
      case GgmlType::IQ4_XS: iq4_xs_block(x, dst); break;
    }
  }
}

namespace {
// d = amax/127 and the codes of n values (std::round: half away from zero); returns d.
float quantize_block(const float* x, int8_t* q, size_t n) {
  float amax = 0;
  for (size_t j = 0; j < n; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  for (size_t j = 0; j < n; ++j) q[j] = int8_t(std::round(x[j] * id));
  return d;
}

void quantize_activations_scalar(const float* x, std::byte* out, size_t K) {
  auto* q = reinterpret_cast<int8_t*>(out);
  auto* d = reinterpret_cast<float*>(out + K);
  for (size_t b = 0; b < K / 32; ++b, x += 32, q += 32) d[b] = quantize_block(x, q, 32);
}

void quantize_activations_k_scalar(const float* x, std::byte* out, size_t K) {
  const size_t nb = K / 256;
  auto* q = reinterpret_cast<int8_t*>(out);
  auto* d = reinterpret_cast<float*>(out + K);
  auto* bsums = reinterpret_cast<int16_t*>(out + K + 4 * nb);
  for (size_t b = 0; b < nb; ++b, x += 256, q += 256) {
    d[b] = quantize_block(x, q, 256);
    for (int j = 0; j < 16; ++j) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += q[16 * j + l];
      bsums[16 * b + size_t(j)] = int16_t(sum);
    }
  }
}

const detail::QuantKernels& quant_isa() {
  static const detail::QuantKernels& k = quant_vnni_supported()       ? detail::kQuantAvx512
                                         : isa_supported(Isa::Avx2) ? detail::kQuantAvx2
                                                                    : detail::kQuantScalar;
  return k;
}
}  // namespace

// A decode step quantizes x before each of its products on the calling thread, while the other
// threads wait: the SIMD forms (the same bytes) took a 2560-value row from 11.8 to 1.4 µs.
void quantize_activations(const float* x, std::byte* out, size_t K) { quant_isa().quantize(x, out, K); }
void quantize_activations_k(const float* x, std::byte* out, size_t K) { quant_isa().quantize_k(x, out, K); }

namespace {

// The scalar reference: the same integer sums and the same per-block scale products as the
// SIMD paths, in plain loops (Q4_0 and Q6_K with signed codes, where SIMD paths take the
// unsigned ones less the offset times the activation sums; the integer sums are equal).
template <GgmlType T, class Row>
float dot_row(const std::byte* row, const Row& a, size_t K) {
  float acc = 0;
  if constexpr (T == GgmlType::Q8_0) {
    for (size_t i = 0; i < K / 32; ++i) {
      const auto* b = reinterpret_cast<const BlockQ8_0*>(row) + i;
      int s = 0;
      for (int j = 0; j < 32; ++j) s += int(b->qs[j]) * a.q[32 * i + size_t(j)];
      acc += float(s) * (f16_to_f32(b->d) * a.d[i]);
    }
  } else if constexpr (T == GgmlType::Q4_0) {
    for (size_t i = 0; i < K / 32; ++i) {
      const auto* b = reinterpret_cast<const BlockQ4_0*>(row) + i;
      const int8_t* q = a.q + 32 * i;
      int s = 0;
      for (int j = 0; j < 16; ++j) s += ((b->qs[j] & 0xF) - 8) * q[j] + ((b->qs[j] >> 4) - 8) * q[j + 16];
      acc += float(s) * (f16_to_f32(b->d) * a.d[i]);
    }
  } else if constexpr (T == GgmlType::Q4_1 || T == GgmlType::Q5_0 || T == GgmlType::Q5_1) {
    for (size_t i = 0; i < K / 32; ++i) {
      const int8_t* q = a.q + 32 * i;
      int s = 0, sx = 0;  // Σ code·x and Σ x
      if constexpr (T == GgmlType::Q5_0) {
        const auto* b = reinterpret_cast<const BlockQ5_0*>(row) + i;
        for (int j = 0; j < 32; ++j) s += (q45_code(b, j) - 16) * q[j];
        acc += float(s) * (f16_to_f32(b->d) * a.d[i]);
      } else {
        const auto* b = reinterpret_cast<const std::conditional_t<T == GgmlType::Q4_1, BlockQ4_1, BlockQ5_1>*>(row) + i;
        for (int j = 0; j < 32; ++j) s += q45_code(b, j) * q[j], sx += q[j];
        acc += float(s) * (f16_to_f32(b->d) * a.d[i]) + float(sx) * (f16_to_f32(b->m) * a.d[i]);
      }
    }
  } else if constexpr (T == GgmlType::Q4_K || T == GgmlType::Q5_K) {
    using Block = std::conditional_t<T == GgmlType::Q4_K, BlockQ4_K, BlockQ5_K>;
    for (size_t i = 0; i < K / 256; ++i) {
      const auto* b = reinterpret_cast<const Block*>(row) + i;
      const int8_t* x = a.q + 256 * i;
      int sum = 0, mins = 0;  // Σ sc·q·x and Σ m·Σx over the sub-blocks, in integers
      for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        scale_min_k4(j, b->scales, sc, m);
        int s = 0;
        for (int l = 0; l < 32; ++l) s += k4_code(b, j, l) * x[32 * j + l];
        sum += sc * s;
        mins += m * (a.bsums[16 * i + size_t(2 * j)] + a.bsums[16 * i + size_t(2 * j + 1)]);
      }
      acc += float(sum) * (f16_to_f32(b->d) * a.d[i]) - float(mins) * (f16_to_f32(b->dmin) * a.d[i]);
    }
  } else if constexpr (T == GgmlType::Q2_K || T == GgmlType::Q3_K) {
    for (size_t i = 0; i < K / 256; ++i) {
      const int8_t* x = a.q + 256 * i;
      int sum = 0, mins = 0;  // Σ sc·q·x over the sub-blocks (Q3_K: (sc − 32)·(q − 4)·x); Q2_K: Σ m·Σx
      if constexpr (T == GgmlType::Q2_K) {
        const auto* b = reinterpret_cast<const BlockQ2_K*>(row) + i;
        for (int j = 0; j < 16; ++j) {
          int s = 0;
          for (int l = 0; l < 16; ++l) s += q2_code(b->qs, 16 * j + l) * x[16 * j + l];
          sum += (b->scales[j] & 0xF) * s;
          mins += (b->scales[j] >> 4) * a.bsums[16 * i + size_t(j)];
        }
        acc += float(sum) * (f16_to_f32(b->d) * a.d[i]) - float(mins) * (f16_to_f32(b->dmin) * a.d[i]);
      } else {
        const auto* b = reinterpret_cast<const BlockQ3_K*>(row) + i;
        uint8_t sc[16];
        q3_k_scales(b->scales, sc);
        for (int j = 0; j < 16; ++j) {
          int s = 0;
          for (int l = 0; l < 16; ++l) s += (q3_code(b, 16 * j + l) - 4) * x[16 * j + l];
          sum += (sc[j] - 32) * s;
        }
        acc += float(sum) * (f16_to_f32(b->d) * a.d[i]);
      }
    }
  } else if constexpr (T == GgmlType::IQ4_NL) {
    for (size_t i = 0; i < K / 32; ++i) {
      const auto* b = reinterpret_cast<const BlockIQ4_NL*>(row) + i;
      int s = 0;
      for (int j = 0; j < 32; ++j) s += kIq4Values[nibble32(b->qs, j)] * a.q[32 * i + size_t(j)];
      acc += float(s) * (f16_to_f32(b->d) * a.d[i]);
    }
  } else if constexpr (T == GgmlType::IQ4_XS) {
    for (size_t i = 0; i < K / 256; ++i) {
      const auto* b = reinterpret_cast<const BlockIQ4_XS*>(row) + i;
      const int8_t* x = a.q + 256 * i;
      int sum = 0;  // Σ (ls − 32)·Σ kv·x over the sub-blocks
      for (int j = 0; j < 8; ++j) {
        int s = 0;
        for (int l = 0; l < 32; ++l) s += kIq4Values[nibble32(b->qs + 16 * j, l)] * x[32 * j + l];
        sum += iq4_xs_scale(b, j) * s;
      }
      acc += float(sum) * (f16_to_f32(b->d) * a.d[i]);
    }
  } else {
    static_assert(T == GgmlType::Q6_K);
    for (size_t i = 0; i < K / 256; ++i) {
      const auto* b = reinterpret_cast<const BlockQ6_K*>(row) + i;
      const int8_t* x = a.q + 256 * i;
      int sum = 0;  // Σ sc·(q − 32)·x, value e in sub-block e/16
      for (int e = 0; e < 256; ++e) sum += b->scales[e / 16] * q6_value(b, e / 128, e % 128 / 32, e % 32) * x[e];
      acc += float(sum) * (f16_to_f32(b->d) * a.d[i]);
    }
  }
  return acc;
}

template <GgmlType T>
void dot_scalar(const detail::GemmArgs& a, size_t n0, size_t n1) {
  for (size_t n = n0; n < n1; ++n)
    for (size_t m = 0; m < a.M; ++m) {
      float v = dot_row<T>(a.w + n * a.ldw_bytes, act_row<T>(a.xq + m * a.ldxq, a.K), a.K);
      if (a.bias) v += a.bias[n];
      a.y[m * a.ldy + n] = v;
    }
}

}  // namespace

namespace detail {
const QuantKernels kQuantScalar = {{&dot_scalar<GgmlType::Q8_0>}, {&dot_scalar<GgmlType::Q4_0>},
                                   {&dot_scalar<GgmlType::Q4_1>}, {&dot_scalar<GgmlType::Q5_0>},
                                   {&dot_scalar<GgmlType::Q5_1>}, {&dot_scalar<GgmlType::Q2_K>},
                                   {&dot_scalar<GgmlType::Q3_K>},
                                   {&dot_scalar<GgmlType::Q4_K>}, {&dot_scalar<GgmlType::Q5_K>},
                                   {&dot_scalar<GgmlType::Q6_K>}, {&dot_scalar<GgmlType::IQ4_NL>},
                                   {&dot_scalar<GgmlType::IQ4_XS>},
                                   &quantize_activations_scalar, &quantize_activations_k_scalar};
}  // namespace detail

bool quant_vnni_supported() {
  static const bool ok = [] {
    unsigned a, b, c, d;  // CPUID.(7,0):ECX[11] AVX512_VNNI
    return isa_supported(Isa::Avx512) && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c >> 11 & 1u);
  }();
  return ok;
}

}  // namespace vlm::kernels
