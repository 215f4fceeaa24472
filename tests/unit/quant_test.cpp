#include "kernels/quant.h"
#include "kernels/matmul.h"
#include "kernels/matmul_isa.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace vlm::kernels {
namespace {

std::vector<std::byte> random_bytes(size_t n, std::mt19937& rng) {
  std::vector<std::byte> b(n);
  for (auto& x : b) x = std::byte(rng() & 0xff);
  return b;
}

// A finite f16 of moderate size at p (block scales), so products stay far from overflow.
void put_scale(std::byte* p, std::mt19937& rng) {
  const uint16_t h = f32_to_f16(std::ldexp(float(rng() % 1000 + 1) / 1000.0f, -int(rng() % 8)) * ((rng() & 1) ? 1.f : -1.f));
  std::memcpy(p, &h, 2);
}

// Random but valid rows: every byte random, then the f16 scales made finite.
std::vector<std::byte> random_rows(GgmlType t, size_t rows, size_t cols, std::mt19937& rng) {
  const size_t rb = quant_row_bytes(t, cols), bb = ggml_traits(t).block_bytes;
  std::vector<std::byte> w = random_bytes(rows * rb, rng);
  for (size_t o = 0; o < w.size(); o += bb) {
    if (t == GgmlType::Q8_0 || t == GgmlType::Q4_0 || t == GgmlType::Q5_0 || t == GgmlType::IQ4_NL ||
        t == GgmlType::IQ4_XS)
      put_scale(&w[o], rng);
    if (t == GgmlType::Q4_1 || t == GgmlType::Q5_1) put_scale(&w[o], rng), put_scale(&w[o + 2], rng);
    if (t == GgmlType::Q2_K) put_scale(&w[o + 80], rng), put_scale(&w[o + 82], rng);
    if (t == GgmlType::Q3_K) put_scale(&w[o + 108], rng);
    if (t == GgmlType::Q4_K || t == GgmlType::Q5_K) put_scale(&w[o], rng), put_scale(&w[o + 2], rng);
    if (t == GgmlType::Q6_K) put_scale(&w[o + 208], rng);
  }
  return w;
}

float f16_at(const std::byte* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// Value i of one block, written from the block layouts in docs/gguf.md bit by bit (not
// from the library's loops), with ggml's f32 operation order.
float expected_value(GgmlType t, const std::byte* blk, int i) {
  const auto* u = reinterpret_cast<const uint8_t*>(blk);
  switch (t) {
    case GgmlType::Q8_0: return float(int8_t(u[2 + i])) * f16_at(blk);
    case GgmlType::Q4_0: {
      const int code = i < 16 ? (u[2 + i] & 15) : (u[2 + i - 16] >> 4);
      return float(code - 8) * f16_at(blk);
    }
    case GgmlType::Q4_1: {  // d, m, then the nibbles as Q4_0's
      const int code = i < 16 ? (u[4 + i] & 15) : (u[4 + i - 16] >> 4);
      const float p = float(code) * f16_at(blk);
      return p + f16_at(blk + 2);
    }
    case GgmlType::Q2_K:
    case GgmlType::Q3_K: {
      // 16 sub-blocks of 16 values. The two low code bits of value i: 32 bytes per half of 128,
      // value 32k + l of the half (l < 32) in bits 2k, 2k+1 of byte l.
      const int half = i / 128, k = i % 128 / 32, l = i % 32, sub = i / 16;
      if (t == GgmlType::Q2_K) {  // 16 bytes scales (sc low nibble, m high), 64 bytes codes, d, dmin
        const int code = (u[16 + 32 * half + l] >> (2 * k)) % 4;
        const float dl = f16_at(blk + 80) * float(u[sub] % 16), ml = f16_at(blk + 82) * float(u[sub] / 16);
        const float p = dl * float(code);
        return p - ml;
      }
      // 32 bytes hmask (bit i/32 of byte l: the code's third bit), 64 bytes codes, 12 bytes scales, d.
      // Sub-block j's 6-bit scale: bytes 0-7 hold the low nibbles (0-7 then 8-15 in the high
      // nibbles), bytes 8-11 the top two bits (byte 8 + j%4, bit pair j/4).
      const int code = ((u[32 + 32 * half + l] >> (2 * k)) % 4) + 4 * ((u[l] >> (i / 32)) % 2);
      const uint8_t* s = u + 96;
      const int sc = ((sub < 8 ? s[sub] % 16 : s[sub - 8] / 16)) + 16 * ((s[8 + sub % 4] >> (2 * (sub / 4))) % 4);
      const float dl = f16_at(blk + 108) * float(sc - 32);
      return dl * float(code - 4);
    }
    case GgmlType::Q5_0:
    case GgmlType::Q5_1: {
      // d (and Q5_1's m) first, then 4 bytes qh whose bit i (little-endian) is value i's fifth bit,
      // then the nibbles as Q4_0's
      const bool one = t == GgmlType::Q5_1;
      const uint8_t* qh = u + (one ? 4 : 2);
      const int nib = i < 16 ? qh[4 + i] % 16 : qh[4 + i - 16] / 16;
      const int code = nib + 16 * ((qh[i / 8] >> (i % 8)) % 2);
      if (!one) return float(code - 16) * f16_at(blk);
      const float p = float(code) * f16_at(blk);
      return p + f16_at(blk + 2);
    }
    case GgmlType::IQ4_NL:
    case GgmlType::IQ4_XS: {
      // ggml's kvalues_iq4nl; IQ4_NL: d then 16 bytes of nibbles (low: values 0-15); IQ4_XS: d, a
      // 16-bit scales_h (bits 2j, 2j+1: the top of sub-block j's 6-bit scale), 4 bytes scales_l
      // (nibble j%2 of byte j/2: its low four bits), then 16 bytes of nibbles per sub-block
      static const int kv[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
      const bool xs = t == GgmlType::IQ4_XS;
      const int sub = xs ? i / 32 : 0, l = i % 32;
      const uint8_t* qs = u + (xs ? 8 + 16 * sub : 2);
      const int code = l < 16 ? qs[l] % 16 : qs[l - 16] / 16;
      if (!xs) return f16_at(blk) * float(kv[code]);
      const int ls = ((u[4 + sub / 2] >> (4 * (sub % 2))) % 16) + 16 * (((u[2] | u[3] << 8) >> (2 * sub)) % 4);
      const float dl = f16_at(blk) * float(ls - 32);
      return dl * float(kv[code]);
    }
    case GgmlType::Q4_K:
    case GgmlType::Q5_K: {
      const int sub = i / 32, l = i % 32;
      const uint8_t* s = u + 4;
      // 6-bit fields: sub-blocks 0-3 in the low 6 bits of bytes 0-3 (scale) and 4-7 (min);
      // 4-7 take their low 4 bits from bytes 8-11 and their top 2 bits from the top of bytes 0-7.
      int sc, mn;
      if (sub < 4) {
        sc = s[sub] & 0x3f;
        mn = s[sub + 4] & 0x3f;
      } else {
        sc = (s[sub + 4] & 0x0f) + 16 * (s[sub - 4] / 64);
        mn = (s[sub + 4] / 16) + 16 * (s[sub] / 64);
      }
      // Q5_K: 32 bytes qh (bit `sub` of byte l is the code's fifth bit) before the 128 bytes of nibbles
      const bool five = t == GgmlType::Q5_K;
      const uint8_t byte = u[(five ? 48 : 16) + 32 * (sub / 2) + l];
      const int code = (sub % 2 ? byte / 16 : byte % 16) + (five ? 16 * ((u[16 + l] >> sub) % 2) : 0);
      const float d1 = f16_at(blk) * float(sc), m1 = f16_at(blk + 2) * float(mn);
      const float p = d1 * float(code);
      return p - m1;
    }
    case GgmlType::Q6_K: {
      const int half = i / 128, e = i % 128, chunk = e / 32, l = e % 32;
      const uint8_t lo = u[64 * half + l + (chunk % 2) * 32];
      const int low4 = chunk < 2 ? lo % 16 : lo / 16;
      const int high2 = (u[128 + 32 * half + l] >> (2 * chunk)) % 4;
      const int8_t sc = int8_t(u[192 + 8 * half + e / 16]);
      return f16_at(blk + 208) * float(sc) * float(low4 + 16 * high2 - 32);
    }
    default: return 0;
  }
}

constexpr GgmlType kBlockTypes[] = {GgmlType::Q8_0, GgmlType::Q4_0,   GgmlType::Q4_1,  GgmlType::Q5_0,
                                    GgmlType::Q5_1, GgmlType::Q2_K,   GgmlType::Q3_K,  GgmlType::Q4_K,
                                    GgmlType::Q5_K, GgmlType::Q6_K,   GgmlType::IQ4_NL, GgmlType::IQ4_XS};

TEST(Quant, DequantizeIsBitExact) {
  std::mt19937 rng(1);
  for (GgmlType t : kBlockTypes) {
    const size_t be = size_t(ggml_traits(t).block_elems), nb = 9;
    const std::vector<std::byte> w = random_rows(t, 1, be * nb, rng);
    std::vector<float> y(be * nb);
    dequantize_row(t, w.data(), y.data(), y.size());
    for (size_t b = 0; b < nb; ++b)
      for (size_t i = 0; i < be; ++i) {
        const float want = expected_value(t, w.data() + b * ggml_traits(t).block_bytes, int(i));
        ASSERT_EQ(f32_to_bits(y[b * be + i]), f32_to_bits(want)) << ggml_type_name(t) << " block " << b << " value " << i;
      }
    // The AVX512 dequantizer of the bf16 prefill GEMM gives the same bits.
    if (!isa_supported(Isa::Avx512)) continue;
    std::vector<float> v(y.size(), NAN);
    detail::dequantize_blocks_avx512(t, w.data(), v.data(), v.size());
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_EQ(f32_to_bits(v[i]), f32_to_bits(y[i])) << ggml_type_name(t) << " avx512 value " << i;
  }
}

TEST(Quant, DequantizeKnownBlocks) {
  // Q8_0: d = 0.5, qs = -16..15 -> -8.0 .. 7.5
  std::vector<std::byte> q8(34);
  const uint16_t half = f32_to_f16(0.5f);
  std::memcpy(q8.data(), &half, 2);
  for (int j = 0; j < 32; ++j) q8[2 + size_t(j)] = std::byte(uint8_t(int8_t(j - 16)));
  float y[32];
  dequantize_row(GgmlType::Q8_0, q8.data(), y, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], float(j - 16) * 0.5f);
  // Q4_0: byte j = 0x(j)(15-j): value j is (15 - j - 8)·d, value 16 + j is (j - 8)·d
  std::vector<std::byte> q4(18);
  std::memcpy(q4.data(), &half, 2);
  for (int j = 0; j < 16; ++j) q4[2 + size_t(j)] = std::byte(uint8_t(j << 4 | (15 - j)));
  dequantize_row(GgmlType::Q4_0, q4.data(), y, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], float(7 - j) * 0.5f);
    EXPECT_EQ(y[16 + j], float(j - 8) * 0.5f);
  }
  // F16 and BF16 rows widen exactly.
  const uint16_t h[2] = {f32_to_f16(-2.5f), f32_to_f16(65504.f)};
  const uint16_t bf[2] = {f32_to_bf16(3.0f), f32_to_bf16(-1e30f)};
  dequantize_row(GgmlType::F16, reinterpret_cast<const std::byte*>(h), y, 2);
  EXPECT_EQ(y[0], -2.5f);
  EXPECT_EQ(y[1], 65504.f);
  dequantize_row(GgmlType::BF16, reinterpret_cast<const std::byte*>(bf), y, 2);
  EXPECT_EQ(y[0], 3.0f);
  EXPECT_EQ(y[1], bf16_to_f32(bf[1]));
}

TEST(Quant, RowBytesRefusesPartialBlocks) {
  EXPECT_EQ(quant_row_bytes(GgmlType::Q4_K, 512), 288u);
  EXPECT_THROW(quant_row_bytes(GgmlType::Q6_K, 300), Error);
}

// Every ISA path against (a) the same product in double over the dequantized weights and the
// quantized activations (only the summation order differs) and (b) dequantize-then-f32 with
// the unquantized activations, within the activation-rounding bound Σ|w|·d_x/2.
TEST(Quant, MatmulMatchesDequantizedReferenceOnEveryIsa) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  ThreadPool pool(3);  // rows split over threads, as in use
  std::string missing;  // a path this CPU cannot run
  for (GgmlType t : kBlockTypes) {
    const size_t be = size_t(ggml_traits(t).block_elems);
    for (size_t K : {be, 3 * be, (be == 32 ? 13 : 3) * be})
      for (size_t N : {1, 7, 33, 300})
        for (size_t M : {1, 2, 3, 5, 7, 8, 13}) {  // the 4- and 8-row groups and their remainders
          const std::vector<std::byte> wb = random_rows(t, N, K, rng);
          std::vector<float> wf(N * K), x(M * K), xq(M * K), bound(M * N, 0.f);
          for (size_t n = 0; n < N; ++n) dequantize_row(t, wb.data() + n * quant_row_bytes(t, K), &wf[n * K], K);
          for (auto& v : x) v = normal(rng);
          // x as the format's kernels take it (Q8Act per 32; the K-quants Q8KAct per 256): the
          // rounded values and each value's block scale.
          const Format& act = format_of(format_of(dtype_of(t)).act);
          // Row 0 all ±1, 2 or 3, one magnitude per activation block: every activation code ±127,
          // so with the random weight bytes' extreme codes and scales the kernels' int16 pair sums
          // reach their limits, and consecutive blocks' scales differ (M = 1 has only this row).
          for (size_t k = 0; k < K; ++k) x[k] = (rng() & 1 ? 1.f : -1.f) * float(1 + k / act.block % 3);
          const size_t row_bytes = act.row_bytes(K);
          std::vector<std::byte> xb(M * row_bytes);
          std::vector<float> dx(M * K);
          for (size_t m = 0; m < M; ++m) {
            std::byte* r = xb.data() + m * row_bytes;
            act.from_f32(&x[m * K], r, K);
            act.to_f32(r, &xq[m * K], K);
            const float* d = act.type == DType::Q8KAct ? q8k_row(r, K).d : q8_row(r, K).d;
            for (size_t k = 0; k < K; ++k) dx[m * K + k] = d[k / act.block];
          }
          std::vector<float> y_avx2;
          for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
            if (!isa_supported(isa) || (isa == Isa::Avx512 && !quant_vnni_supported())) {
              missing = isa_name(isa);
              continue;
            }
            std::vector<float> y(M * N);
            // Through the weight-format table, as the models call it.
            matmul(x.data(), M, Weight{wb.data(), dtype_of(t), N, K}, y.data(), Exec(pool, isa));
            // The 512-bit loops (AVX512: the 256-value formats', and the nibble formats' at M = 1)
            // add the same exact integers as the 256-bit ones in another order and finish them with
            // the same f32 operations in the same order: the same bits, for every format. So do
            // the lane tiles of the batches of Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS (M >= 2), Q4_K,
            // Q5_K, Q2_K, Q3_K (M >= 4), Q8_0 and Q6_K (M >= 5): 16 weight rows per tile against 8;
            // N = 7 and 33 take their copied and overlapping last tiles.
            if (isa == Isa::Avx2) y_avx2 = y;
            if (isa == Isa::Avx512 && !y_avx2.empty())
              for (size_t i = 0; i < y.size(); ++i)
                ASSERT_EQ(y[i], y_avx2[i]) << ggml_type_name(t) << " M" << M << " N" << N << " K" << K << " at " << i;
            for (size_t m = 0; m < M; ++m)
              for (size_t n = 0; n < N; ++n) {
                double exact = 0, mag = 0, ref = 0, err_bound = 0;
                for (size_t k = 0; k < K; ++k) {
                  exact += double(wf[n * K + k]) * xq[m * K + k];
                  mag += std::fabs(double(wf[n * K + k]) * xq[m * K + k]);
                  ref += double(wf[n * K + k]) * x[m * K + k];
                  err_bound += std::fabs(double(wf[n * K + k])) * dx[m * K + k] / 2;
                }
                const double got = y[m * N + n];
                ASSERT_NEAR(got, exact, 1e-5 * mag + 1e-30)
                    << ggml_type_name(t) << " " << isa_name(isa) << " M" << M << " N" << N << " K" << K;
                ASSERT_LE(std::fabs(got - ref), err_bound * 1.0001 + 1e-5 * mag)
                    << ggml_type_name(t) << " " << isa_name(isa);
              }
          }
        }
  }
  // Skipped, not passed, where a path went untested (the paths the CPU has were checked above).
  if (!missing.empty()) GTEST_SKIP() << "this CPU lacks the " << missing << " path: not tested";
}

// More rows than the format's dot_rows (AMX: 32) at Precision::Bf16 on AVX512-BF16 with a bf16
// GEMM (Exec::bf16_gemm Dot, Amx where this CPU has tiles, and AmxModel): the weights are dequantized exactly and
// rounded to bf16 with x, then summed in f32 on vdpbf16ps or the tiles; so within
// (K + 2)·u·Σ|x̂·ŵ| of the double product of the rounded values, and not the Q8-activation result
// of Precision::F32. Up to those rows, and at any M where the FMAs are the faster route, that
// result bit for bit.
TEST(Quant, Bf16PrecisionPrefillRoundsDequantizedWeights) {
  if (!bf16_dot_supported()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.f, 1.f);
  ThreadPool pool(3);
  constexpr double kU = 1.0 / (1 << 24);
  for (Bf16Gemm gemm : {Bf16Gemm::Dot, Bf16Gemm::Amx, Bf16Gemm::AmxModel})
  for (GgmlType t : kBlockTypes) {
    if (gemm == Bf16Gemm::Amx && !amx_supported()) continue;
    const size_t be = size_t(ggml_traits(t).block_elems);
    // up to these the int8 kernels stay
    const size_t rows = std::min(format_of(dtype_of(t)).dot_rows, gemm == Bf16Gemm::Dot ? SIZE_MAX : size_t(32));
    for (size_t K : {be, 3 * be, (be == 32 ? 13 : 5) * be})  // K blocks of 256 and their remainders
      for (size_t N : {1, 70, 130})
        for (size_t M : {size_t(50), rows, rows + 1, rows + 40}) {
          const std::vector<std::byte> wb = random_rows(t, N, K, rng);
          std::vector<float> wr(N * K), x(M * K);
          for (size_t n = 0; n < N; ++n) dequantize_row(t, wb.data() + n * quant_row_bytes(t, K), &wr[n * K], K);
          for (auto& v : wr) v = round_bf16(v);
          for (auto& v : x) v = normal(rng);
          const Weight w{wb.data(), dtype_of(t), N, K};
          std::vector<float> y(M * N, NAN), y32(M * N, NAN);
          Exec bf(pool, Isa::Avx512, Precision::Bf16);
          // M = 50: a CPU whose bf16 GEMMs are the slower route keeps the int8 kernels, and so
          // does any CPU up to those rows
          bf.bf16_gemm = M != 50 ? gemm : Bf16Gemm::Fma;
          matmul(x.data(), M, w, y.data(), bf);
          matmul(x.data(), M, w, y32.data(), Exec(pool, Isa::Avx512, Precision::F32));
          if (bf.bf16_gemm == Bf16Gemm::Fma || M <= rows) {
            for (size_t i = 0; i < y.size(); ++i)
              ASSERT_EQ(y[i], y32[i]) << ggml_type_name(t) << " M" << M << " N" << N << " K" << K << ": not the int8 kernels";
            continue;
          }
          size_t differ = 0;
          for (size_t m = 0; m < M; ++m)
            for (size_t n = 0; n < N; ++n) {
              double exact = 0, mag = 0;
              for (size_t k = 0; k < K; ++k) {
                const double p = double(wr[n * K + k]) * round_bf16(x[m * K + k]);
                exact += p;
                mag += std::fabs(p);
              }
              ASSERT_NEAR(y[m * N + n], exact, (K + 2) * kU * mag + 1e-30)
                  << bf16_gemm_name(gemm) << " " << ggml_type_name(t) << " M" << M << " N" << N << " K" << K;
              differ += y[m * N + n] != y32[m * N + n];
            }
          EXPECT_GT(differ, 0u) << ggml_type_name(t) << ": the bf16 path was not taken";
        }
  }
}

// Strided rows (a wider stored row), strided x/y and a bias: the same numbers as the dense
// product plus the bias, on every ISA.
TEST(Quant, StridedRowsAndBiasOnEveryIsa) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 1.f);
  ThreadPool pool(2);
  for (GgmlType t : kBlockTypes) {
    const size_t K = 2 * size_t(ggml_traits(t).block_elems), N = 9, M = 4, pad = quant_row_bytes(t, K) / 2;
    const size_t rb = quant_row_bytes(t, K);
    const std::vector<std::byte> dense = random_rows(t, N, K, rng);
    std::vector<std::byte> wide(N * (rb + pad));
    for (size_t n = 0; n < N; ++n) std::memcpy(&wide[n * (rb + pad)], &dense[n * rb], rb);
    std::vector<float> x(M * (K + 3)), bias(N), y0(M * N), y1(M * (N + 5));
    for (auto& v : x) v = normal(rng);
    for (auto& v : bias) v = normal(rng);
    for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
      if (!isa_supported(isa)) continue;
      const Exec ex(pool, isa);
      matmul_strided(x.data(), K + 3, M, Weight{dense.data(), dtype_of(t), N, K}, Layout::NK, nullptr, y0.data(), N, ex);
      matmul_strided(x.data(), K + 3, M, Weight{wide.data(), dtype_of(t), N, K, rb + pad}, Layout::NK, bias.data(),
                     y1.data(), N + 5, ex);
      for (size_t m = 0; m < M; ++m)
        for (size_t n = 0; n < N; ++n)
          ASSERT_EQ(y1[m * (N + 5) + n], y0[m * N + n] + bias[n]) << ggml_type_name(t) << " " << isa_name(isa);
    }
  }
}

// quantize_row then dequantize_row: every value within its format's step (Q8_0 amax/127 of the
// block, Q4_0 amax/8, Q5_0 amax/16, Q4_1 (max − min)/15, Q5_1 /31, Q4_K (max − min)/15 (Q5_K
// /31, Q2_K /3) of the sub-block plus the scale/min rounding, Q6_K amax/31 (Q3_K amax/4) of the
// sub-block plus the scale rounding), and Q8_0 exactly ggml's rule.
TEST(Quant, QuantizeRowRoundTripsWithinTheStep) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (GgmlType t : kBlockTypes) {
    const size_t n = 4 * 256;
    std::vector<float> x(n), y(n);
    for (auto& v : x) v = normal(rng) * ((rng() & 3) ? 1.f : 0.01f);
    std::vector<std::byte> q(quant_row_bytes(t, n));
    quantize_row(t, x.data(), q.data(), n);
    dequantize_row(t, q.data(), y.data(), n);
    const size_t group = t == GgmlType::Q6_K || t == GgmlType::Q2_K || t == GgmlType::Q3_K ? 16 : 32;
    for (size_t g = 0; g < n; g += group) {
      float amax = 0, lo = 0, hi = x[g];
      for (size_t i = g; i < g + group; ++i) amax = std::max(amax, std::fabs(x[i])), lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
      float step = t == GgmlType::Q8_0   ? amax / 127
                   : t == GgmlType::Q4_0 ? amax / 8
                   : t == GgmlType::Q5_0 ? amax / 16
                   : t == GgmlType::Q4_1 ? (hi - lo) / 15
                   : t == GgmlType::Q5_1 ? (hi - lo) / 31
                   : t == GgmlType::Q2_K ? (hi - lo) / 3
                   : t == GgmlType::Q3_K ? amax / 4
                   : t == GgmlType::Q4_K ? (hi - lo) / 15
                   : t == GgmlType::Q5_K ? (hi - lo) / 31
                                         : amax / 31;
      // the super-block's 6-bit (Q4_K, Q5_K) / 8-bit (Q6_K) sub-block scales add up to half a scale unit per code
      float sb = 0;
      for (size_t i = g / 256 * 256; i < g / 256 * 256 + 256; ++i) sb = std::max(sb, std::fabs(x[i]));
      if (t == GgmlType::Q4_K || t == GgmlType::Q5_K) step += 2 * sb / 63;
      // Q2_K's 4-bit scales (d = max/15 of the sub-blocks' ranges/3 ≤ 2·sb/45) and mins (dmin ≤ sb/15)
      // are half a unit off at most: 3·d/2 + dmin/2 at the top code
      if (t == GgmlType::Q2_K) step += 2 * (sb / 15 + sb / 30);
      // Q3_K's signed 6-bit scales of d = max/31 (≤ sb/124), half a unit off, times codes up to 4
      if (t == GgmlType::Q3_K) step += 2 * sb / 62;
      // IQ4: the codebook's widest gap is 24 and it ends at 113 against −127 (14), in units of the
      // (sub-)block's amax/127; IQ4_XS's sub-block scale is a 6-bit multiple of d = max/31, half
      // a unit off at most, which moves values up to 127 units by 63.5·d (and widens the 14)
      if (t == GgmlType::IQ4_NL || t == GgmlType::IQ4_XS) step = 2 * 14 * amax / 127;
      if (t == GgmlType::IQ4_XS) step += 2 * 78 * sb / (127 * 31);
      if (t == GgmlType::Q6_K) step += 32 * sb / 31 / 127;
      // half a step (Q4_0, Q5_0, Q3_K: a whole one, their codes reach −8·d (−16·d, −4·d) but only
      // +7·d (+15·d, +3·d); Q4_1, Q5_1: a whole one, its codes are truncated from +0.5 after the f16 rounding of m) + the f16
      // rounding of the block scale (relative 2^-11, at most amax away)
      const float half = t == GgmlType::Q4_0 || t == GgmlType::Q5_0 || t == GgmlType::Q4_1 || t == GgmlType::Q5_1 ||
                                 t == GgmlType::Q3_K
                             ? 1.f
                             : 0.5f;
      for (size_t i = g; i < g + group; ++i)
        ASSERT_LE(std::fabs(y[i] - x[i]), step * half * 1.01f + amax / 1024 + 1e-6f) << ggml_type_name(t) << " value " << i;
    }
  }
  // Q8_0: d = f16(amax/127), q = round-half-away(x·127/amax).
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = float(j - 16) / 4;  // amax 4
  std::byte b[34];
  quantize_row(GgmlType::Q8_0, x, b, 32);
  uint16_t d;
  std::memcpy(&d, b, 2);
  EXPECT_EQ(d, f32_to_f16(4.0f / 127));
  for (int j = 0; j < 32; ++j) EXPECT_EQ(int8_t(b[2 + j]), int8_t(std::round(x[j] * (127 / 4.0f)))) << j;
}

// The activation quantizer of every ISA writes the scalar one's bytes: the block scales, the
// sums and the codes, on values that land exactly on a half (ties round away from zero), zero
// blocks and ordinary ones.
TEST(Quant, ActivationQuantizerIsTheSameOnEveryIsa) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 1.f);
  const size_t K = 64 * 32;
  std::vector<float> x(K);
  for (size_t b = 0; b < K / 32; ++b) {
    float* blk = &x[b * 32];
    if (b % 4 == 0) {  // d = 127 · 0.25 / 127: x·(1/d) = ±(2j + 1)/2, every one a half, and 127
      for (int j = 0; j < 32; ++j) blk[j] = (j % 2 ? 1.f : -1.f) * float(2 * j + 1) * 0.125f;
      blk[31] = 127 * 0.25f;
    } else if (b % 4 == 1) {
      std::fill(blk, blk + 32, 0.f);
    } else {
      for (int j = 0; j < 32; ++j) blk[j] = normal(rng) * (b % 4 == 2 ? 1.f : 1e-3f);
    }
  }
  std::fill(x.end() - 256, x.end(), 0.f);  // a zero block of 256 as well
  // Q8_0-style per 32 (Q8Act) and Q8_K-style per 256 (Q8KAct: the halves block sets amax 127·0.25
  // for its whole 256, so its codes land on halves too).
  using Quantizer = void (*)(const float*, std::byte*, size_t);
  const struct {
    Quantizer scalar, avx2, avx512;
    size_t bytes;
  } kinds[] = {{detail::kQuantScalar.quantize, detail::kQuantAvx2.quantize, detail::kQuantAvx512.quantize, K / 32 * kQ8BlockBytes},
               {detail::kQuantScalar.quantize_k, detail::kQuantAvx2.quantize_k, detail::kQuantAvx512.quantize_k,
                K / 256 * kQ8KBlockBytes}};
  std::string missing;
  std::vector<std::vector<std::byte>> want;
  for (const auto& kind : kinds) {
    want.emplace_back(kind.bytes);
    kind.scalar(x.data(), want.back().data(), K);
    for (Isa isa : {Isa::Avx2, Isa::Avx512}) {
      if (!isa_supported(isa) || (isa == Isa::Avx512 && !quant_vnni_supported())) {
        missing = isa_name(isa);
        continue;
      }
      std::vector<std::byte> got(kind.bytes);
      (isa == Isa::Avx2 ? kind.avx2 : kind.avx512)(x.data(), got.data(), K);
      for (size_t i = 0; i < kind.bytes; ++i) ASSERT_EQ(got[i], want.back()[i]) << isa_name(isa) << " byte " << i;
    }
  }
  // The halves above do round away: x·(1/d) = −0.5 → −1 and −2.5 → −3 in block 0.
  const Q8Row r = q8_row(want[0].data(), K);
  EXPECT_EQ(r.q[0], -1);
  EXPECT_EQ(r.q[2], -3);
  // Per 256: d = amax/127 of the block, q = round-half-away(x/d), bsums the codes' sums per 16.
  const Q8KRow rk = q8k_row(want[1].data(), K);
  for (size_t b = 0; b < K / 256; ++b) {
    float amax = 0;
    for (size_t i = 0; i < 256; ++i) amax = std::max(amax, std::fabs(x[256 * b + i]));
    ASSERT_EQ(rk.d[b], amax / 127.0f) << b;
    const float id = amax > 0 ? 127.0f / amax : 0.0f;
    for (size_t j = 0; j < 16; ++j) {
      int sum = 0;
      for (size_t l = 0; l < 16; ++l) {
        const size_t i = 256 * b + 16 * j + l;
        const float t = x[i] * (rk.d[b] != 0 ? 1.0f / rk.d[b] : 0.0f);
        ASSERT_NEAR(float(rk.q[i]), x[i] * id, 0.5001f) << i;
        ASSERT_EQ(rk.q[i], int8_t(std::round(t))) << i;
        sum += rk.q[i];
      }
      ASSERT_EQ(rk.bsums[16 * b + j], sum) << b << " " << j;
    }
  }
  EXPECT_EQ(rk.q[0], -1);  // block 0 starts with the halves: amax 127·0.25 over its 256 values
  if (!missing.empty()) GTEST_SKIP() << "this CPU lacks the " << missing << " path: not tested";
}

TEST(Quant, MatmulRefusesPartialBlocksAndKnLayout) {
  float x[64] = {}, y[4];
  std::vector<std::byte> w(1024);
  ThreadPool pool(1);
  const Exec ex(pool, Isa::Scalar);
  EXPECT_THROW(matmul(x, 1, Weight{w.data(), DType::Q8_0, 1, 48}, y, ex), Error);
  EXPECT_THROW(matmul_kn(x, 1, Weight{w.data(), DType::Q8_0, 32, 32}, y, ex), Error);
  EXPECT_THROW(matmul(x, 1, Weight{w.data(), DType::Q8Act, 1, 32}, y, ex), Error);
}

}  // namespace
}  // namespace vlm::kernels
