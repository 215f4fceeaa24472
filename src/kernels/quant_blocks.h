// ggml's block layouts (ggml-common.h block_q8_0, block_q4_0, block_q4_1, block_q5_0, block_q5_1, block_q2_K,
// block_q3_K, block_q4_K, block_q5_K, block_q6_K, block_iq4_nl, block_iq4_xs) and the
// small accessors every quant path shares. Internal to src/kernels/quant*.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace vlm::kernels::quant_blocks {

inline uint16_t load_u16(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

#pragma pack(push, 1)
struct BlockQ8_0 {  // 32 values: d · qs[j]
  uint16_t d;       // f16
  int8_t qs[32];
};
struct BlockQ4_0 {  // 32 values: d · (nibble − 8); low nibbles are values 0..15, high 16..31
  uint16_t d;
  uint8_t qs[16];
};
struct BlockQ4_1 {  // 32 values: d · nibble + m, nibbles as Q4_0's
  uint16_t d, m;
  uint8_t qs[16];
};
struct BlockQ5_0 {  // 32 values: d · (q − 16), q = nibble + 16 · bit j of qh (nibbles as Q4_0's)
  uint16_t d;
  uint8_t qh[4];     // bit j (of the little-endian 32-bit word): value j's fifth bit
  uint8_t qs[16];
};
struct BlockQ5_1 {  // 32 values: d · q + m, q as Q5_0's
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ2_K {       // 256 values in 16 sub-blocks of 16: d·sc·q − dmin·m, q in 0..3
  uint8_t scales[16];    // sub-block j: sc in the low nibble, m in the high one
  uint8_t qs[64];        // 32 bytes per half of 128: bits 2k..2k+1 of byte l are value 32k + l (l < 32)
  uint16_t d, dmin;      // f16
};
struct BlockQ3_K {       // 256 values in 16 sub-blocks of 16: d·(sc − 32)·(q − 4), q in 0..7
  uint8_t hmask[32];     // bit 4·half + k of byte l: bit 2 of q of value 128·half + 32k + l
  uint8_t qs[64];        // q's low two bits, laid out as BlockQ2_K's qs
  uint8_t scales[12];    // 6-bit sc per sub-block, packed (q3_k_scales)
  uint16_t d;            // f16
};
struct BlockQ4_K {       // 256 values in 8 sub-blocks of 32: d·sc·q − dmin·m
  uint16_t d, dmin;      // f16
  uint8_t scales[12];    // 6-bit sc and m per sub-block, packed (scale_min_k4)
  uint8_t qs[128];       // 32 bytes per pair of sub-blocks: low nibbles first, high second
};
struct BlockQ5_K {       // Q4_K with a fifth code bit: 256 values, d·sc·q − dmin·m, q in 0..31
  uint16_t d, dmin;      // f16
  uint8_t scales[12];    // as BlockQ4_K's
  uint8_t qh[32];        // bit j of qh[l]: the fifth bit of value l of sub-block j
  uint8_t qs[128];       // the low four bits, laid out as BlockQ4_K's qs
};
struct BlockQ6_K {       // 256 values in 16 sub-blocks of 16: d·sc·(q − 32)
  uint8_t ql[128];       // low 4 bits
  uint8_t qh[64];        // high 2 bits
  int8_t scales[16];
  uint16_t d;
};
struct BlockIQ4_NL {  // 32 values: d · kIq4Values[nibble], nibbles as Q4_0's
  uint16_t d;
  uint8_t qs[16];
};
struct BlockIQ4_XS {     // 256 values in 8 sub-blocks of 32: d · (ls − 32) · kIq4Values[nibble]
  uint16_t d;
  uint16_t scales_h;     // bits 2j, 2j + 1: the top two bits of sub-block j's 6-bit ls
  uint8_t scales_l[4];   // the low four bits of ls: sub-block j in nibble j % 2 of byte j / 2
  uint8_t qs[128];       // 16 bytes per sub-block, nibbles as Q4_0's
};
#pragma pack(pop)
static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockIQ4_NL) == 18 && sizeof(BlockIQ4_XS) == 136);

// The IQ4 codebook (ggml-common.h kvalues_iq4nl): a code's value before the block scale.
inline constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// The nibble of value j (0..31) of a 32-value group of 16 bytes: low nibbles are values 0-15.
inline int nibble32(const uint8_t* qs, int j) { return j < 16 ? qs[j] & 0x0F : qs[j - 16] >> 4; }

// Sub-block j's signed scale ls − 32 (−32..31) of an IQ4_XS block.
inline int iq4_xs_scale(const BlockIQ4_XS* b, int j) {
  return (((b->scales_l[j / 2] >> 4 * (j % 2)) & 0x0F) | (((b->scales_h >> 2 * j) & 3) << 4)) - 32;
}

// Sub-block j's 6-bit scale and min (ggml-quants.c get_scale_min_k4).
inline void scale_min_k4(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// The six-bit scales (0..63, before the − 32) of a Q3_K block's 16 sub-blocks (ggml's
// dequantize_row_q3_K): sub-block j's low four bits are nibble j / 8 of byte j % 8, its top two
// bits are bits 2·(j / 4) of byte 8 + j % 4.
inline void q3_k_scales(const uint8_t* s, uint8_t (&sc)[16]) {
  for (int j = 0; j < 16; ++j) sc[j] = uint8_t(((s[j % 8] >> 4 * (j / 8)) & 0xF) | ((s[8 + j % 4] >> 2 * (j / 4)) & 3) << 4);
}

// The 2-bit code of value e (0..255) of a Q2_K or Q3_K block's qs.
inline int q2_code(const uint8_t* qs, int e) { return (qs[32 * (e / 128) + e % 32] >> 2 * (e % 128 / 32)) & 3; }
// The code (0..7) of value e of a Q3_K block: value q − 4.
inline int q3_code(const BlockQ3_K* b, int e) {
  return q2_code(b->qs, e) | ((b->hmask[e % 32] >> (e / 32)) & 1) << 2;
}

// The unsigned code of value j (0..31) of a Q4_1 (0..15), Q5_0 or Q5_1 (0..31) block.
template <class Block>
inline int q45_code(const Block* b, int j) {
  if constexpr (!requires { b->qh; }) {
    return nibble32(b->qs, j);
  } else {
    uint32_t qh;
    std::memcpy(&qh, b->qh, 4);
    return nibble32(b->qs, j) | int((qh >> j) & 1) << 4;
  }
}

// The unsigned code of value l (0..31) of sub-block j (0..7) of a Q4_K (0..15) or Q5_K (0..31) block.
template <class Block>
inline int k4_code(const Block* b, int j, int l) {
  const uint8_t q = b->qs[32 * (j / 2) + l];
  const int low = (j & 1) ? q >> 4 : q & 0x0F;
  if constexpr (requires { b->qh; }) return low | (((b->qh[l] >> j) & 1) << 4);
  else return low;
}

// The unsigned 6-bit code (0..63) of value l (0..31) of 32-value chunk k (0..3) of half `half`.
inline int q6_code(const BlockQ6_K* b, int half, int k, int l) {
  const uint8_t* ql = b->ql + 64 * half;
  const uint8_t* qh = b->qh + 32 * half;
  const int lo = (k & 1) ? ql[l + 32] : ql[l];
  return ((k < 2 ? lo & 0xF : lo >> 4) | (((qh[l] >> (2 * k)) & 3) << 4));
}
inline int q6_value(const BlockQ6_K* b, int half, int k, int l) { return q6_code(b, half, k, l) - 32; }

}  // namespace vlm::kernels::quant_blocks
