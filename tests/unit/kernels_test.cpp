// Matmul paths (every ISA this CPU has) against matmul_ref and an exact double
// product, and the row/element ops against plain double-precision loops.
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kernels/quant.h"

namespace vlm::kernels {
namespace {

constexpr double kU = 1.0 / (1 << 24);  // f32 unit roundoff

// A weight stored in a given dtype, with its exactly representable f32 values.
struct StoredWeight {
  std::vector<std::byte> bytes;
  std::vector<float> values;  // [rows, cols] as the kernels see them
  Weight w;
};

StoredWeight make_weight(DType dt, size_t rows, size_t cols, std::mt19937& rng, size_t ld = 0) {
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  const size_t stride = ld ? ld : cols, es = dtype_size(dt);
  StoredWeight s;
  s.bytes.resize(rows * stride * es);
  s.values.resize(rows * cols);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < stride; ++c) {
      float v = dist(rng);
      std::byte* p = s.bytes.data() + (r * stride + c) * es;
      if (dt == DType::F32) {
        std::memcpy(p, &v, 4);
      } else {
        const uint16_t h = dt == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
        std::memcpy(p, &h, 2);
        v = dt == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
      }
      if (c < cols) s.values[r * cols + c] = v;
    }
  s.w = Weight{s.bytes.data(), dt, rows, cols, ld * es};
  return s;
}

std::vector<float> random_vec(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Any summation order of K f32 products is within (K + 1)·u·Σ|x·w| of the exact sum,
// so that is the stated tolerance against the exact (double) product; a wrong index
// or a dropped term is off by O(Σ|x·w| / K) or more.
void expect_close(const float* y, size_t ldy, const float* x, size_t ldx, size_t M,
                  const std::vector<float>& wv, size_t N, size_t K, bool kn, const float* bias,
                  const std::string& what) {
  double worst = 0;
  for (size_t m = 0; m < M; ++m)
    for (size_t n = 0; n < N; ++n) {
      double exact = bias ? bias[n] : 0.0, mag = bias ? std::fabs(bias[n]) : 0.0;
      for (size_t k = 0; k < K; ++k) {
        const double p = double(x[m * ldx + k]) * (kn ? wv[k * N + n] : wv[n * K + k]);
        exact += p;
        mag += std::fabs(p);
      }
      const double err = std::fabs(y[m * ldy + n] - exact), tol = (K + 2) * kU * mag + 1e-30;
      worst = std::max(worst, err / tol);
      ASSERT_LE(err, tol) << what << " m=" << m << " n=" << n << " y=" << y[m * ldy + n]
                          << " exact=" << exact;
    }
  EXPECT_LE(worst, 1.0) << what;
}

std::vector<Isa> isas() {
  std::vector<Isa> v;
  for (Isa i : {Isa::Scalar, Isa::Avx2, Isa::Avx512})
    if (isa_supported(i)) v.push_back(i);
  return v;
}

const DType kDTypes[] = {DType::F32, DType::F16, DType::BF16};

TEST(Matmul, EveryPathMatchesReferenceOnOddShapes) {
  ThreadPool pool(2);
  std::mt19937 rng(7);
  struct Shape {
    size_t M, N, K;
  };
  std::vector<Shape> shapes;
  for (size_t M = 1; M <= 17; ++M) shapes.push_back({M, 37, 45});
  for (size_t K : {1, 7, 15, 16, 17, 31, 32, 33, 129, 300}) shapes.push_back({3, 19, K});
  for (size_t K : {1, 16, 33, 129, 300}) shapes.push_back({13, 70, K});
  for (size_t N : {1, 2, 15, 16, 17, 63, 64, 65, 129, 520, 1100}) shapes.push_back({9, N, 40});
  shapes.push_back({1, 1, 1});
  shapes.push_back({1, 300, 5000});   // large K, GEMV
  shapes.push_back({40, 130, 3000});  // large K, packed
  shapes.push_back({200, 1, 70});     // N = 1, many rows
  // packed path (M above the dot-product threshold): odd tiles and K/N tails
  for (size_t K : {1, 17, 129, 300}) shapes.push_back({37, 70, K});
  for (size_t N : {1, 15, 65, 520}) shapes.push_back({50, N, 33});
  for (Isa isa : isas()) {
    const Exec ex(pool, isa);
    for (DType dt : kDTypes)
      for (const Shape& s : shapes) {
        const StoredWeight w = make_weight(dt, s.N, s.K, rng);
        const auto x = random_vec(s.M * s.K, rng);
        std::vector<float> y(s.M * s.N, NAN), ref(s.M * s.N, NAN);
        matmul(x.data(), s.M, w.w, y.data(), ex);
        matmul_ref(x.data(), s.M, w.w, ref.data());
        const std::string what = std::string(isa_name(isa)) + " " + std::string(dtype_name(dt)) +
                                 " M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) +
                                 " K=" + std::to_string(s.K);
        expect_close(y.data(), s.N, x.data(), s.K, s.M, w.values, s.N, s.K, false, nullptr, what);
        expect_close(ref.data(), s.N, x.data(), s.K, s.M, w.values, s.N, s.K, false, nullptr,
                     what + " (ref)");
        // Both are within the bound of the exact product, hence of each other.
        for (size_t i = 0; i < y.size(); ++i)
          ASSERT_NEAR(y[i], ref[i], 2 * (s.K + 2) * kU * s.K) << what;
      }
  }
}

// A prefill's products split into column panels × row blocks by the thread count (16 threads: 4
// blocks of 64 rows for 3 panels). Every output is one task's sum in the same K order, so any
// pool gives the same bits.
TEST(Matmul, ThreadCountDoesNotChangeTheBits) {
  std::mt19937 rng(11);
  ThreadPool one(1), two(2), five(5), sixteen(16);
  struct Shape {
    size_t M, N, K;
  };
  const Shape shapes[] = {{256, 130, 70}, {200, 64, 300}, {999, 1100, 40}, {130, 2048, 33}};
  for (Isa isa : isas())
    for (Precision pr : {Precision::F32, Precision::Bf16})
      for (DType dt : {DType::F32, DType::BF16})
        for (const Shape& s : shapes) {
          const StoredWeight w = make_weight(dt, s.N, s.K, rng);
          const auto x = random_vec(s.M * s.K, rng);
          std::vector<float> want(s.M * s.N, NAN);
          matmul(x.data(), s.M, w.w, want.data(), Exec(one, isa, pr));
          // Every output written, near the exact product (bf16 inputs: relative 2^-8 each).
          std::vector<float> ref(s.M * s.N);
          matmul_ref(x.data(), s.M, w.w, ref.data());
          for (size_t i = 0; i < ref.size(); ++i) {
            double mag = 0;
            for (size_t k = 0; k < s.K; ++k) mag += std::fabs(x[i / s.N * s.K + k] * w.values[i % s.N * s.K + k]);
            ASSERT_NEAR(want[i], ref[i], 1e-2 * mag + 1e-6) << "M=" << s.M << " N=" << s.N << " at " << i;
          }
          for (ThreadPool* pool : {&two, &five, &sixteen}) {
            std::vector<float> y(s.M * s.N, NAN);
            matmul(x.data(), s.M, w.w, y.data(), Exec(*pool, isa, pr));
            ASSERT_EQ(0, std::memcmp(y.data(), want.data(), y.size() * sizeof(float)))
                << isa_name(isa) << " " << precision_name(pr) << " " << dtype_name(dt) << " M=" << s.M
                << " N=" << s.N << " K=" << s.K << " threads=" << pool->size();
          }
        }
}

TEST(Matmul, BiasStridesAndKnLayout) {
  ThreadPool pool(2);
  std::mt19937 rng(11);
  for (Isa isa : isas()) {
    const Exec ex(pool, isa);
    for (DType dt : kDTypes)
      for (size_t M : {1, 4, 5, 30, 47}) {
        const size_t N = 83, K = 150, ldx = K + 9, ldy = N + 5;
        const auto x = random_vec(M * ldx, rng);
        const auto bias = random_vec(N, rng);
        // nk with bias, strided x / y, and a weight row stride wider than K.
        const StoredWeight w = make_weight(dt, N, K, rng, K + 3);
        std::vector<float> y(M * ldy, NAN);
        matmul_strided(x.data(), ldx, M, w.w, Layout::NK, bias.data(), y.data(), ldy, ex);
        const std::string what = std::string(isa_name(isa)) + " " + std::string(dtype_name(dt)) +
                                 " M=" + std::to_string(M);
        expect_close(y.data(), ldy, x.data(), ldx, M, w.values, N, K, false, bias.data(),
                     what + " nk+bias");
        for (size_t m = 0; m < M; ++m)
          for (size_t j = N; j < ldy; ++j) ASSERT_TRUE(std::isnan(y[m * ldy + j])) << "wrote past N";
        // kn layout: W stored [K, N].
        const StoredWeight wkn = make_weight(dt, K, N, rng);
        std::vector<float> ykn(M * N);
        std::vector<float> xc(M * K);
        for (size_t m = 0; m < M; ++m)
          for (size_t k = 0; k < K; ++k) xc[m * K + k] = x[m * ldx + k];
        matmul_kn(xc.data(), M, wkn.w, ykn.data(), ex);
        expect_close(ykn.data(), N, xc.data(), K, M, wkn.values, N, K, true, nullptr, what + " kn");
        // matmul_bias is matmul_strided with dense strides.
        std::vector<float> yb(M * N);
        const StoredWeight wd = make_weight(dt, N, K, rng);
        matmul_bias(xc.data(), M, wd.w, bias.data(), yb.data(), ex);
        expect_close(yb.data(), N, xc.data(), K, M, wd.values, N, K, false, bias.data(),
                     what + " bias");
      }
  }
}

// The bf16 GEMMs this CPU has (Exec::bf16_gemm Dot: vdpbf16ps; Amx: TDPBF16PS tiles; AmxModel: the
// tile kernels on a scalar model of the tiles, wherever the dot is).
std::vector<Bf16Gemm> bf16_gemms() {
  std::vector<Bf16Gemm> v;
  if (bf16_dot_supported()) v.insert(v.end(), {Bf16Gemm::Dot, Bf16Gemm::AmxModel});
  if (amx_supported()) v.push_back(Bf16Gemm::Amx);
  return v;
}

TEST(Matmul, Bf16GemmsRoundXOnly) {
  if (!bf16_dot_supported()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  ThreadPool pool(2);
  const Exec exact(pool, Isa::Avx512);
  std::mt19937 rng(12);
  struct Shape {
    size_t M, N, K;
  };
  // Past the dot's rows (bf16 weights on Dot or the tiles: 64, else 32) the packed GEMM (AMX: 32-row
  // blocks and their remainders, 16-column tiles and K steps of 32 with theirs); up to them the dot
  // kernels (M = 1, the 4-row groups and their remainders, their sums held across 512-column blocks
  // for up to 64 rows, tails of K below one 32-value vector; on the tiles, bf16 weights from 6 rows
  // as A tiles: 16, 32 or 64 x rows, blocks of 32 or 16 weight rows and their remainders, K's tail
  // past whole steps; past 64 rows, K beyond one 2048-value block of the tile GEMM's sums).
  const Shape shapes[] = {{33, 70, 45},  {40, 1, 1},   {37, 65, 17},  {50, 130, 256}, {45, 64, 257},
                          {100, 520, 600}, {64, 17, 31}, {200, 96, 33}, {1, 37, 45},   {1, 300, 1000},
                          {1, 9, 7},     {2, 5, 1},    {3, 19, 129},  {4, 130, 256},  {7, 66, 300},
                          {8, 70, 2560}, {32, 21, 95}, {1, 1027, 130}, {96, 48, 64}, {65, 600, 530},
                          {48, 70, 1100}, {61, 33, 700}, {20, 70, 45},  {17, 64, 33},  {12, 200, 31},
                          {70, 40, 2100}};
  // f16 weights too: on the tiles as (hi, lo) bf16 pairs (gemm_amx_f16), elsewhere on the f32
  // kernels; either way every bit of the weight counts (dropping lo is off by 2^-9 of a product).
  for (Bf16Gemm gemm : bf16_gemms())
    for (DType dt : {DType::BF16, DType::F16}) {
      Exec bf(pool, Isa::Avx512, Precision::Bf16);
      bf.bf16_gemm = gemm;
      for (const Shape& s : shapes) {
        const StoredWeight w = make_weight(dt, s.N, s.K, rng);
        const auto x = random_vec(s.M * s.K, rng);
        std::vector<float> y(s.M * s.N, NAN), y_exact(s.M * s.N);
        matmul(x.data(), s.M, w.w, y.data(), bf);
        matmul(x.data(), s.M, w.w, y_exact.data(), exact);
        // Against the exact product of x rounded to bf16 (nearest even): only the f32
        // summation differs, so the usual (K + 2)·u·Σ|x·w| bound applies.
        std::vector<float> xr(x.size());
        for (size_t i = 0; i < x.size(); ++i) xr[i] = round_bf16(x[i]);
        const std::string what = std::string(bf16_gemm_name(gemm)) + " " + std::string(dtype_name(dt)) + " M=" +
                                 std::to_string(s.M) + " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K);
        expect_close(y.data(), s.N, xr.data(), s.K, s.M, w.values, s.N, s.K, false, nullptr, what);
        // and the stated bound against the exact f32-activation product: 2^-8·Σ|x·w| more.
        size_t differ = 0;
        for (size_t m = 0; m < s.M; ++m)
          for (size_t n = 0; n < s.N; ++n) {
            double exact = 0, mag = 0;
            for (size_t k = 0; k < s.K; ++k) {
              const double p = double(x[m * s.K + k]) * w.values[n * s.K + k];
              exact += p;
              mag += std::fabs(p);
            }
            ASSERT_NEAR(y[m * s.N + n], exact, (1.0 / 256 + (s.K + 2) * kU) * mag) << what;
            differ += y[m * s.N + n] != y_exact[m * s.N + n];
          }
        if (s.K > 1) EXPECT_GT(differ, 0u) << what << ": the bf16 path was not taken";
        // Rows ldx and ldy apart with a bias: y's cells between the rows untouched.
        const size_t ldx = s.K + 3, ldy = s.N + 5;
        std::vector<float> xs(s.M * ldx, NAN), ys(s.M * ldy, -7.f), bias(s.N);
        for (size_t m = 0; m < s.M; ++m) std::copy_n(xr.data() + m * s.K, s.K, xs.data() + m * ldx);
        for (auto& b : bias) b = random_vec(1, rng)[0];
        matmul_strided(xs.data(), ldx, s.M, w.w, Layout::NK, bias.data(), ys.data(), ldy, bf);
        expect_close(ys.data(), ldy, xr.data(), s.K, s.M, w.values, s.N, s.K, false, bias.data(), what + " strided");
        for (size_t m = 0; m < s.M; ++m)
          for (size_t n = s.N; n < ldy; ++n)
            ASSERT_EQ(ys[m * ldy + n], -7.f) << what << " strided: wrote past row " << m;
      }
    }
}

// An f16 weight of ±Inf or NaN stays what it is on the tiles (its lo is 0, not Inf − Inf): the
// f32 kernels' ±Inf and NaN in those columns, every other column finite.
TEST(Matmul, F16NonFiniteWeightsOnTheTiles) {
  if (!bf16_dot_supported()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  ThreadPool pool(2);
  std::mt19937 rng(14);
  const size_t M = 40, N = 20, K = 70;
  StoredWeight w = make_weight(DType::F16, N, K, rng);
  const uint16_t specials[] = {0x7C00, 0xFC00, 0x7E00};  // +Inf, -Inf, NaN
  for (size_t j = 0; j < 3; ++j) std::memcpy(w.bytes.data() + 2 * ((3 + 5 * j) * K + 11), &specials[j], 2);
  std::vector<float> x(M * K);
  for (auto& v : x) v = std::uniform_real_distribution<float>(0.5f, 1.f)(rng);
  std::vector<Bf16Gemm> gemms{Bf16Gemm::Fma};
  for (Bf16Gemm g : bf16_gemms())
    if (g != Bf16Gemm::Dot) gemms.push_back(g);
  for (Bf16Gemm g : gemms) {
    Exec ex(pool, Isa::Avx512, Precision::Bf16);
    ex.bf16_gemm = g;
    std::vector<float> y(M * N);
    matmul(x.data(), M, w.w, y.data(), ex);
    for (size_t m = 0; m < M; ++m)
      for (size_t n = 0; n < N; ++n) {
        const float v = y[m * N + n];
        const std::string at = std::string(bf16_gemm_name(g)) + " m=" + std::to_string(m) + " n=" + std::to_string(n);
        if (n == 3) EXPECT_EQ(v, INFINITY) << at;
        else if (n == 8) EXPECT_EQ(v, -INFINITY) << at;
        else if (n == 13) EXPECT_TRUE(std::isnan(v)) << at;
        else EXPECT_TRUE(std::isfinite(v)) << at;
      }
  }
}

// mark_bf16_exact: an f16 value counts when it is a bf16 value (or a NaN), checked for all 65536
// of them against round_bf16. An f16 weight of bf16 values, marked, runs on the bf16 GEMMs as the
// same values stored in bf16 do, to the bit (past the dot's rows: K blocks with tails, odd K);
// one value off by its last bit leaves the weight unmarked.
TEST(Matmul, F16OfBf16ValuesRunsAsBf16) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t v = uint16_t(h);
    Weight w{reinterpret_cast<const std::byte*>(&v), DType::F16, 1, 1};
    mark_bf16_exact(w);
    const float f = f16_to_f32(v);
    ASSERT_EQ(w.bf16_exact, std::isnan(f) || round_bf16(f) == f) << "f16 0x" << std::hex << h;
  }
  std::mt19937 rng(15);
  StoredWeight random = make_weight(DType::F16, 4, 40, rng);
  mark_bf16_exact(random.w);
  EXPECT_FALSE(random.w.bf16_exact);
  if (!bf16_dot_supported()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  ThreadPool pool(2);
  struct Shape {
    size_t M, N, K;
  };
  const Shape shapes[] = {{70, 33, 45}, {100, 130, 300}, {65, 64, 257}, {96, 20, 600}};
  for (const Shape& s : shapes) {
    const StoredWeight b = make_weight(DType::BF16, s.N, s.K, rng);
    std::vector<uint16_t> h(s.N * s.K);
    for (size_t i = 0; i < h.size(); ++i) h[i] = f32_to_f16(b.values[i]);
    Weight f{reinterpret_cast<const std::byte*>(h.data()), DType::F16, s.N, s.K};
    mark_bf16_exact(f);
    ASSERT_TRUE(f.bf16_exact) << "N=" << s.N << " K=" << s.K;
    const auto x = random_vec(s.M * s.K, rng);
    for (Bf16Gemm gemm : bf16_gemms()) {
      Exec bf(pool, Isa::Avx512, Precision::Bf16);
      bf.bf16_gemm = gemm;
      std::vector<float> yb(s.M * s.N), yf(s.M * s.N, NAN);
      matmul(x.data(), s.M, b.w, yb.data(), bf);
      matmul(x.data(), s.M, f, yf.data(), bf);
      for (size_t i = 0; i < yb.size(); ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(yf[i]), std::bit_cast<uint32_t>(yb[i]))
            << bf16_gemm_name(gemm) << " M=" << s.M << " N=" << s.N << " K=" << s.K << " at " << i;
    }
    h[h.size() / 2] ^= 1;
    mark_bf16_exact(f);
    EXPECT_FALSE(f.bf16_exact);
  }
}

// The M = 1 bf16 dot peels the values before the weights' first 64-byte line boundary and
// places x at the same offset (aligning_lead, bf16_x); the dot tiles (2..64 rows) and the FMA
// twins (AVX512: 5..32 rows, AVX2: 2..32) start their groups at that boundary (fma_dot_shift,
// wide_x); the tile kernels (40 rows, on the model) pack weights from any offset: the same
// products at every offset a tensor can sit at in a file, including ones with no whole line in a
// short row.
TEST(Matmul, Bf16DotAtEveryWeightOffset) {
  ThreadPool pool(2);
  std::mt19937 rng(13);
  struct Path {
    Isa isa;
    Bf16Gemm gemm;
    std::vector<size_t> rows;
  };
  std::vector<Path> paths;
  if (bf16_dot_supported())
    paths = {{Isa::Avx512, Bf16Gemm::Dot, {1, 2, 3, 6, 8}}, {Isa::Avx512, Bf16Gemm::Fma, {1, 3, 8}},
             {Isa::Avx512, Bf16Gemm::AmxModel, {8, 17, 40}}};
  if (isa_supported(Isa::Avx2)) paths.push_back({Isa::Avx2, Bf16Gemm::Fma, {1, 3, 8}});
  for (const Path& path : paths) {
    const Isa isa = path.isa;
    Exec dot(pool, isa, Precision::Bf16);
    dot.bf16_gemm = path.gemm;
    for (size_t M : path.rows)
      for (size_t K : {32, 96, 2560}) {
        const size_t N = 300;
        const StoredWeight w = make_weight(DType::BF16, N, K, rng);
        const auto x = random_vec(M * K, rng);
        std::vector<float> xr(M * K);
        for (size_t k = 0; k < M * K; ++k) xr[k] = round_bf16(x[k]);
        std::vector<std::byte> buf(w.bytes.size() + 128);
        const uintptr_t line = (reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t(63);
        for (size_t off : {0, 2, 4, 16, 34, 48, 62}) {
          auto* p = reinterpret_cast<std::byte*>(line + off);
          std::memcpy(p, w.bytes.data(), w.bytes.size());
          std::vector<float> y(M * N, NAN);
          matmul(x.data(), M, Weight{p, DType::BF16, N, K}, y.data(), dot);
          expect_close(y.data(), N, xr.data(), K, M, w.values, N, K, false, nullptr,
                       std::string(isa_name(isa)) + " " + bf16_gemm_name(path.gemm) + " M=" + std::to_string(M) +
                           " K=" + std::to_string(K) + " offset " + std::to_string(off));
        }
      }
  }
}

// Precision::Bf16 on every ISA path and weight dtype (on AVX512-BF16 with the GEMMs on each
// Bf16Gemm this CPU has): the exact products of x rounded to
// bf16 (nearest even) with the stored weights, summed in f32 — so within the usual
// (K + 2)·u·Σ|x̂·w| of the double product of the rounded x, and equal to matmul_ref's
// Bf16 mode within twice that; the f32 mode of the same call must differ somewhere.
TEST(Matmul, Bf16PrecisionOnEveryPathRoundsX) {
  ThreadPool pool(2);
  std::mt19937 rng(21);
  struct Shape {
    size_t M, N, K;
  };
  // M = 5..32 on AVX512-BF16 with Fma or Amx: the dot's FMA twin, K across its 256-column
  // blocks and off whole 32-value groups.
  const Shape shapes[] = {{1, 37, 45},  {1, 300, 1000}, {3, 19, 129},   {16, 70, 33},  {33, 70, 45},
                          {40, 130, 300}, {64, 17, 31}, {5, 66, 600},  {8, 130, 2560}, {32, 21, 95}};
  std::vector<Bf16Gemm> gemms = bf16_gemms();
  gemms.insert(gemms.begin(), Bf16Gemm::Fma);
  for (Isa isa : isas())
    for (Bf16Gemm gemm : gemms) {
      if (gemm != Bf16Gemm::Fma && isa != Isa::Avx512) continue;
      Exec bf(pool, isa, Precision::Bf16);
      bf.bf16_gemm = gemm;
      const Exec exact(pool, isa);
      for (DType dt : kDTypes)
        for (const Shape& s : shapes) {
          const StoredWeight w = make_weight(dt, s.N, s.K, rng);
          const auto x = random_vec(s.M * s.K, rng);
          std::vector<float> xr(x.size());
          for (size_t i = 0; i < x.size(); ++i) xr[i] = round_bf16(x[i]);
          std::vector<float> y(s.M * s.N, NAN), ref(s.M * s.N, NAN), y32(s.M * s.N, NAN);
          matmul(x.data(), s.M, w.w, y.data(), bf);
          matmul(x.data(), s.M, w.w, y32.data(), exact);
          matmul_ref(x.data(), s.M, w.w, ref.data(), Precision::Bf16);
          const std::string what = std::string(isa_name(isa)) + " " + bf16_gemm_name(gemm) + " bf16-precision " +
                                   std::string(dtype_name(dt)) + " M=" + std::to_string(s.M) +
                                   " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K);
          expect_close(y.data(), s.N, xr.data(), s.K, s.M, w.values, s.N, s.K, false, nullptr, what);
          expect_close(ref.data(), s.N, xr.data(), s.K, s.M, w.values, s.N, s.K, false, nullptr,
                       what + " (ref)");
          size_t differ = 0;
          for (size_t i = 0; i < y.size(); ++i) differ += y[i] != y32[i];
          EXPECT_GT(differ, 0u) << what << ": x was not rounded";
        }
    }
}

// matmul_each: the same outputs as one matmul() per product, to the bit, whether it runs them
// as one loop (one format, the dot route) or one by one (mixed formats, a large M, a weight at
// another offset in its 64-byte line), on every ISA path and precision.
TEST(Matmul, EachEqualsOneMatmulPerProduct) {
  ThreadPool pool(2);
  std::mt19937 rng(29);
  const size_t K = 512;
  struct Stored {
    std::vector<std::byte> bytes;
    Weight w;
  };
  // rows × K of format dt, at `offset` bytes past a 64-byte line.
  auto make = [&](DType dt, GgmlType gt, size_t rows, size_t offset) {
    Stored s;
    const size_t rb = quant_row_bytes(gt, K);
    s.bytes.resize(rows * rb + 64 + offset);
    const uintptr_t line = (reinterpret_cast<uintptr_t>(s.bytes.data()) + 63) & ~uintptr_t(63);
    auto* p = reinterpret_cast<std::byte*>(line + offset);
    const auto v = random_vec(rows * K, rng);
    for (size_t r = 0; r < rows; ++r) quantize_row(gt, v.data() + r * K, p + r * rb, K);
    s.w = Weight{p, dt, rows, K};
    return s;
  };
  const std::pair<DType, GgmlType> formats[] = {
      {DType::F32, GgmlType::F32},   {DType::BF16, GgmlType::BF16},     {DType::Q8_0, GgmlType::Q8_0},
      {DType::F16, GgmlType::F16},   {DType::Q4_0, GgmlType::Q4_0},     {DType::Q4_1, GgmlType::Q4_1},
      {DType::Q5_0, GgmlType::Q5_0}, {DType::Q5_1, GgmlType::Q5_1},     {DType::Q2_K, GgmlType::Q2_K},
      {DType::Q3_K, GgmlType::Q3_K}, {DType::Q4_K, GgmlType::Q4_K},     {DType::Q5_K, GgmlType::Q5_K},
      {DType::Q6_K, GgmlType::Q6_K}, {DType::IQ4_NL, GgmlType::IQ4_NL}, {DType::IQ4_XS, GgmlType::IQ4_XS}};
  std::vector<Exec> execs;
  for (Isa isa : isas())
    for (Precision pr : {Precision::F32, Precision::Bf16}) {
      execs.emplace_back(pool, isa, pr);
      if (isa == Isa::Avx512 && pr == Precision::Bf16 && bf16_dot_supported()) {  // the tiles' model too
        execs.emplace_back(pool, isa, pr);
        execs.back().bf16_gemm = Bf16Gemm::AmxModel;
      }
    }
  for (const Exec& ex : execs)
    for (size_t M : {1, 3, 8, 40})
      for (int mix = 0; mix < 3; ++mix)  // one format; v in another; v at another offset
        for (size_t f = 0; f < std::size(formats); ++f) {
          const Isa isa = ex.isa;
          const Precision pr = ex.precision;
          const auto [dt, gt] = formats[f];
          const auto [vdt, vgt] = mix != 1 ? formats[f] : formats[f == 2 ? 1 : 2];  // Q8_0, or BF16 beside Q8_0
          const Stored q = make(dt, gt, 300, 0), k = make(dt, gt, 70, 0), v = make(vdt, vgt, 130, mix == 2 ? 32 : 0);
          const auto x = random_vec(M * K, rng);
          std::vector<float> yq(M * 300), yk(M * 70), yv(M * 130), eq(yq.size()), ek(yk.size()), ev(yv.size());
          matmul(x.data(), M, q.w, eq.data(), ex);
          matmul(x.data(), M, k.w, ek.data(), ex);
          matmul(x.data(), M, v.w, ev.data(), ex);
          const Product ps[] = {{q.w, yq.data()}, {k.w, yk.data()}, {v.w, yv.data()}};
          matmul_each(x.data(), M, ps, ex);
          const std::string what = std::string(isa_name(isa)) + " " + precision_name(pr) + " " +
                                   bf16_gemm_name(ex.bf16_gemm) + " " + format_of(dt).name +
                                   " M=" + std::to_string(M) + " mix " + std::to_string(mix);
          EXPECT_EQ(0, std::memcmp(yq.data(), eq.data(), 4 * eq.size())) << what << " q";
          EXPECT_EQ(0, std::memcmp(yk.data(), ek.data(), 4 * ek.size())) << what << " k";
          EXPECT_EQ(0, std::memcmp(yv.data(), ev.data(), 4 * ev.size())) << what << " v";
        }
}

TEST(Matmul, FormatTableRows) {
  for (DType dt : kDTypes) {
    const Format& f = format_of(dt);
    EXPECT_EQ(f.type, dt);
    EXPECT_EQ(f.block, 1u);
    EXPECT_EQ(f.row_bytes(10), 10 * dtype_size(dt));
    EXPECT_EQ(f.act, DType::F32);
    for (Isa isa : isas()) EXPECT_NE(f.isa[int(isa)].dot, nullptr) << f.name << " " << isa_name(isa);
    std::mt19937 rng(2);
    const StoredWeight w = make_weight(dt, 1, 33, rng);
    std::vector<float> row(33);
    f.to_f32(w.w.data, row.data(), 33);
    EXPECT_EQ(row, w.values) << f.name;
  }
  EXPECT_THROW(format_of(DType(200)), Error);
}

TEST(Matmul, EmptyKGivesBias) {
  ThreadPool pool(2);
  const float bias[3] = {1.f, -2.f, 3.f};
  std::vector<float> y(6, NAN);
  const Weight w{nullptr, DType::BF16, 3, 0};
  matmul_bias(nullptr, 2, w, bias, y.data(), pool);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(y[i], bias[i % 3]);
}

TEST(Matmul, RejectsStridesShorterThanRows) {
  ThreadPool pool(1);
  std::vector<float> x(64), w(64), y(64);
  EXPECT_THROW(matmul(x.data(), 2, f32_weight(w.data(), 4, 8, 6), y.data(), pool), Error);
  EXPECT_THROW(matmul_strided(x.data(), 7, 2, f32_weight(w.data(), 4, 8), Layout::NK, nullptr,
                              y.data(), 4, pool),
               Error);
  EXPECT_THROW(matmul_strided(x.data(), 8, 2, f32_weight(w.data(), 4, 8), Layout::NK, nullptr,
                              y.data(), 3, pool),
               Error);
}

TEST(Matmul, IsaSelection) {
  ThreadPool pool(1);
  EXPECT_TRUE(isa_supported(Isa::Scalar));
  EXPECT_TRUE(isa_supported(best_isa()));
  const Exec dflt = pool;  // a plain pool: the best path, exact f32
  EXPECT_EQ(dflt.isa, best_isa());
  EXPECT_EQ(dflt.precision, Precision::F32);
  for (Isa isa : isas()) {
    EXPECT_EQ(Exec(pool, isa).isa, isa);
    EXPECT_EQ(parse_isa(isa_name(isa), "VLM_ISA"), isa);
  }
  for (Isa isa : {Isa::Avx2, Isa::Avx512})
    if (!isa_supported(isa)) {
      EXPECT_THROW(Exec(pool, isa), Error);
      EXPECT_THROW(parse_isa(isa_name(isa), "VLM_ISA"), Error);
    }
  try {
    parse_isa("sse9", "VLM_ISA");
    ADD_FAILURE() << "sse9 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("VLM_ISA=sse9"), std::string::npos) << e.what();
  }
  EXPECT_EQ(parse_precision("bf16", "--precision"), Precision::Bf16);
  EXPECT_EQ(parse_precision("f32", "--precision"), Precision::F32);
  EXPECT_THROW(parse_precision("fp8", "--precision"), Error);
}

// ---- ops ----

// round_to_bf16 and to_bf16 on every path: bit for bit vlm::round_bf16 and f32_to_bf16, ties to
// even included, NaN kept NaN, infinities and values that round up to infinity, subnormals, and a
// tail shorter than a vector (to_bf16 writing nothing past it).
TEST(Ops, RoundToBf16IsRoundBf16OnEveryPath) {
  std::vector<float> x = {0.f, -0.f, 1.f, -1.5f, INFINITY, -INFINITY, NAN, -NAN, 3.4028235e38f, 1e-40f, -1e-45f};
  // Halfway with an even bf16 (stays) and an odd one (rounds up), just below and above halfway, and
  // the largest low half (carries into the exponent).
  for (uint32_t bits : {0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u, 0x3f80ffffu})
    x.push_back(bits_to_f32(bits));
  std::mt19937 rng(31);
  for (int i = 0; i < 61; ++i) x.push_back(bits_to_f32(uint32_t(rng())));
  for (Isa isa : isas()) {
    std::vector<float> y(x.size(), 7.f);
    round_to_bf16(x.data(), y.data(), x.size(), isa);
    for (size_t i = 0; i < x.size(); ++i)
      EXPECT_EQ(f32_to_bits(y[i]), f32_to_bits(round_bf16(x[i]))) << isa_name(isa) << " x " << x[i];
    std::vector<uint16_t> h(x.size() + 1, 0x1234);
    to_bf16(x.data(), h.data(), x.size(), isa);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(h[i], f32_to_bf16(x[i])) << isa_name(isa) << " x " << x[i];
    EXPECT_EQ(h.back(), 0x1234) << isa_name(isa);
  }
}

// Rows of every tail length that end where a page ends, the next page inaccessible: the partial
// vectors of each path (AVX-512's masked loads and stores, AVX2's masked loads, the copies) read and
// write nothing past the row, and give what the scalar path gives within 8 ulp (the vector paths sum
// in another order).
TEST(Ops, TailsStopAtTheRowsEnd) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  void* map = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(map, MAP_FAILED);
  ASSERT_EQ(mprotect(static_cast<char*>(map) + page, page, PROT_NONE), 0);
  float* end = reinterpret_cast<float*>(static_cast<char*>(map) + page);
  std::mt19937 rng(5);
  for (size_t n = 1; n <= 40; ++n) {
    const std::vector<float> x = random_vec(n, rng), mask = random_vec(n, rng);
    float* row = end - n;
    auto run = [&](Isa isa) {
      std::vector<float> out;
      std::copy(x.begin(), x.end(), row);
      gelu_tanh(row, n, isa);
      out.insert(out.end(), row, end);
      std::copy(x.begin(), x.end(), row);
      scaled_softmax(row, n, 0.7f, mask.data(), true, isa);
      out.insert(out.end(), row, end);
      std::copy(x.begin(), x.end(), row);
      out.push_back(scaled_exp(row, n, 1.3f, nullptr, isa));
      out.insert(out.end(), row, end);
      return out;
    };
    const std::vector<float> want = run(Isa::Scalar);
    for (Isa isa : isas()) {
      const std::vector<float> got = run(isa);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_NEAR(got[i], want[i], 8 * kU * std::fabs(want[i]) + 1e-30) << isa_name(isa) << " n " << n << " at " << i;
    }
  }
  munmap(map, 2 * page);
}

TEST(Ops, RmsNormMatchesDouble) {
  for (Isa isa : isas()) {
    SCOPED_TRACE(isa_name(isa));
    std::mt19937 rng(3);
    const size_t rows = 5, dim = 333;
    auto x = random_vec(rows * dim, rng), w = random_vec(dim, rng);
    for (size_t i = 0; i < dim; ++i) x[i] *= 1000.f;  // a large-magnitude row
    std::vector<float> y(rows * dim);
    rms_norm(x.data(), w.data(), y.data(), rows, dim, 1e-6f, isa);
    for (size_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (size_t i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
      const double inv = 1.0 / std::sqrt(ss / dim + 1e-6);
      for (size_t i = 0; i < dim; ++i) {
        const double want = x[r * dim + i] * inv * (1.0 + w[i]);
        // mean(x²) summed in f32 in any order: relative error ≤ dim·u, halved by the
        // square root; then a few roundings of values of size |want|.
        EXPECT_NEAR(y[r * dim + i], want, (dim / 2 + 4) * kU * std::fabs(want) + 1e-30) << r << "," << i;
      }
    }
    // in place
    std::vector<float> z = x;
    rms_norm(z.data(), w.data(), z.data(), rows, dim, 1e-6f, isa);
    EXPECT_EQ(z, y);
  }
}

TEST(Ops, LayerNormMatchesDouble) {
  for (Isa isa : isas()) {
    SCOPED_TRACE(isa_name(isa));
    std::mt19937 rng(4);
    const size_t rows = 4, dim = 1152;
    auto x = random_vec(rows * dim, rng), g = random_vec(dim, rng), b = random_vec(dim, rng);
    for (size_t i = 0; i < dim; ++i) x[dim + i] += 50.f;  // a row with a large mean
    std::vector<float> y(rows * dim);
    layer_norm(x.data(), g.data(), b.data(), y.data(), rows, dim, 1e-6f, isa);
    for (size_t r = 0; r < rows; ++r) {
      double s = 0, v = 0;
      for (size_t i = 0; i < dim; ++i) s += x[r * dim + i];
      const double mean = s / dim;
      for (size_t i = 0; i < dim; ++i) v += (x[r * dim + i] - mean) * (x[r * dim + i] - mean);
      const double inv = 1.0 / std::sqrt(v / dim + 1e-6);
      for (size_t i = 0; i < dim; ++i) {
        const double t = (x[r * dim + i] - mean) * inv * g[i];
        // x − mean is rounded at the scale of |x|: allow that, times inv·|g|.
        // the mean and variance are f32 sums (≤ dim·u relative) ...
        const double tol = (dim / 2 + 4) * kU * (std::fabs(t) + std::fabs(b[i]) + std::fabs(g[i])) +
                           2 * kU * std::fabs(x[r * dim + i]) * inv * std::fabs(g[i]);
        EXPECT_NEAR(y[r * dim + i], t + b[i], tol) << r << "," << i;
      }
    }
  }
}

TEST(Ops, GeluTanhMatchesFormula) {
  for (Isa isa : isas()) {
    SCOPED_TRACE(isa_name(isa));
    std::vector<float> x;
    for (float v = -12.f; v <= 12.f; v += 0.01f) x.push_back(v);
    x.push_back(0.f);
    x.push_back(-0.f);
    x.push_back(1e-30f);
    x.push_back(30000.f);
    x.push_back(-30000.f);
    std::vector<float> y = x, up(x.size()), gm = x;
    for (size_t i = 0; i < x.size(); ++i) up[i] = float(i % 7) - 3.f;
    gelu_tanh(y.data(), y.size(), isa);
    gelu_tanh_mul(gm.data(), up.data(), gm.size(), isa);
    for (size_t i = 0; i < x.size(); ++i) {
      const double v = x[i];
      const double want = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
      // 1 + tanh(z) cancels for z ≪ 0; its f32 error is ~u, scaled by 0.5·|x|.
      const double tol = 8 * kU * std::fabs(want) + 2 * kU * std::fabs(v);
      ASSERT_NEAR(y[i], want, tol) << "x=" << v;
      ASSERT_TRUE(std::isfinite(y[i]));
      ASSERT_EQ(gm[i], y[i] * up[i]) << "x=" << v;
    }
  }
}

// scaled_softmax is the scaling (x · scale, then + mask, two f32 roundings), softmax() and
// round_to_bf16() one after the other, bit for bit, on every ISA: rows with tails, a mask with
// blocked (−inf, lowest) entries, and a row the mask blocks entirely; scaled_exp times 1/sum too.
TEST(Ops, ScaledSoftmaxIsScaleThenSoftmaxThenRounding) {
  for (Isa isa : isas()) {
    SCOPED_TRACE(isa_name(isa));
    std::mt19937 rng(9);
    for (size_t n : {1, 7, 16, 37, 4096}) {
      const auto x = random_vec(n, rng);
      auto mask = random_vec(n, rng);
      for (size_t i = 0; i < n; i += 3) mask[i] = i % 2 ? -INFINITY : std::numeric_limits<float>::lowest();
      const std::vector<float> blocked(n, -INFINITY);
      const std::vector<float>* masks[] = {nullptr, &mask, &blocked};
      for (const std::vector<float>* m : masks)
        for (bool round : {false, true}) {
          std::vector<float> want(n), got = x;
          for (size_t i = 0; i < n; ++i) {
            const float t = x[i] * 0.37f;
            want[i] = m ? t + (*m)[i] : t;
          }
          softmax(want.data(), n, isa);
          if (round) round_to_bf16(want.data(), want.data(), n, isa);
          scaled_softmax(got.data(), n, 0.37f, m ? m->data() : nullptr, round, isa);
          for (size_t i = 0; i < n; ++i)
            ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i])) << n << "," << i << "," << round;
          if (round) continue;
          // scaled_exp is the same before the division: times 1/sum (0 for a blocked row), the bits again.
          std::vector<float> e = x;
          const float sum = scaled_exp(e.data(), n, 0.37f, m ? m->data() : nullptr, isa);
          const float inv = sum > 0.f ? 1.f / sum : 0.f;
          for (size_t i = 0; i < n; ++i)
            ASSERT_EQ(std::bit_cast<uint32_t>(e[i] * inv), std::bit_cast<uint32_t>(want[i])) << n << "," << i;
        }
    }
  }
}

TEST(Ops, SoftmaxMatchesDoubleAndStaysFinite) {
  for (Isa isa : isas()) {
    SCOPED_TRACE(isa_name(isa));
    std::mt19937 rng(5);
    for (size_t n : {1, 2, 15, 16, 17, 100, 4096}) {
      auto x = random_vec(n, rng);
      for (auto& v : x) v *= 30.f;
      std::vector<float> y = x;
      softmax(y.data(), n, isa);
      double mx = -INFINITY, s = 0;
      for (float v : x) mx = std::max(mx, double(v));
      for (float v : x) s += std::exp(v - mx);
      for (size_t i = 0; i < n; ++i) {
        const double want = std::exp(x[i] - mx) / s;
        // x − max is rounded in f32 (abs. error u·|x − max|, amplified by exp), then a
        // few roundings in exp, the sum and the division.
        const double tol = want * (2 * kU * (std::fabs(x[i]) + std::fabs(mx)) + 16 * kU) + 1e-44;
        EXPECT_NEAR(y[i], want, tol) << n << "," << i;
      }
    }
    const float lo = std::numeric_limits<float>::lowest();
    std::vector<float> all_low(37, lo);
    softmax(all_low.data(), all_low.size(), isa);
    for (float v : all_low) EXPECT_FLOAT_EQ(v, 1.f / 37);
    // a masked row: lowest f32 everywhere but two entries
    std::vector<float> masked(20, lo);
    masked[3] = 0.f;
    masked[7] = 0.f;
    softmax(masked.data(), masked.size(), isa);
    for (size_t i = 0; i < masked.size(); ++i) EXPECT_EQ(masked[i], (i == 3 || i == 7) ? 0.5f : 0.f);
    std::vector<float> all_inf(5, -INFINITY);
    softmax(all_inf.data(), all_inf.size(), isa);
    for (float v : all_inf) EXPECT_EQ(v, 0.f);
    // exp underflow: results below FLT_MIN are flushed to 0 (stated bound: FLT_MIN)
    std::vector<float> wide = {0.f, -50.f, -87.f, -88.f, -100.f, -1e30f, 3.f};
    std::vector<float> yw = wide;
    softmax(yw.data(), yw.size(), isa);
    double sw = 0;
    for (float v : wide) sw += std::exp(double(v) - 3.0);
    for (size_t i = 0; i < wide.size(); ++i) {
      const double want = std::exp(double(wide[i]) - 3.0) / sw;
      EXPECT_NEAR(yw[i], want, want * 300 * kU + std::numeric_limits<float>::min()) << wide[i];
    }
  }
}

TEST(Ops, RopeRotateHalfMatchesDouble) {
  std::mt19937 rng(6);
  const size_t heads = 3, d = 24, half = d / 2;
  std::vector<float> inv(half), c(half), s(half);
  rope_inv_freq(d, 10000.f, 1.f, inv.data());
  for (size_t i = 0; i < half; ++i) {
    const double want = 1.0 / std::pow(10000.0, double(float(2 * i) / float(d)));
    EXPECT_NEAR(inv[i], want, 2 * kU * want) << i;
  }
  std::vector<float> inv8(half);
  rope_inv_freq(d, 1e6f, 8.f, inv8.data());
  for (size_t i = 0; i < half; ++i) {
    // the exponent 2i/d is an f32 (as HF computes it), so compare with its exact power
    const double want = 1.0 / std::pow(1e6, double(float(2 * i) / float(d))) / 8;
    EXPECT_NEAR(inv8[i], want, 2 * kU * want) << i;
  }
  const int64_t pos = 777;
  rope_cos_sin(pos, inv.data(), half, c.data(), s.data());
  for (size_t i = 0; i < half; ++i) {
    const float t = float(pos) * inv[i];  // the f32 angle, as docs/gemma3/decoder.md#rope defines it
    EXPECT_NEAR(c[i], std::cos(double(t)), 2 * kU);
    EXPECT_NEAR(s[i], std::sin(double(t)), 2 * kU);
  }
  const auto x = random_vec(heads * d, rng);
  std::vector<float> y = x;
  rope_rotate_half(y.data(), heads, d, c.data(), s.data());
  for (size_t h = 0; h < heads; ++h)
    for (size_t i = 0; i < half; ++i) {
      const double a = x[h * d + i], b = x[h * d + i + half];
      EXPECT_NEAR(y[h * d + i], a * c[i] - b * s[i], 4 * kU);
      EXPECT_NEAR(y[h * d + i + half], b * c[i] + a * s[i], 4 * kU);
    }
}

// ---- thread pool ----

TEST(ThreadPool, ChunksCoverTheRangeOnceAtAnyGrain) {
  ThreadPool pool(3);
  for (size_t grain : {0, 1, 7, 64, 5000})
    for (size_t n : {1, 2, 3, 1001}) {
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(n, [&](size_t b, size_t e) {
        ASSERT_LT(b, e);
        ASSERT_LE(e, n);
        if (grain) ASSERT_LE(e - b, grain);
        for (size_t i = b; i < e; ++i) hits[i]++;
      }, grain);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " grain=" << grain;
    }
}

TEST(ThreadPool, RethrowsTheFirstErrorAfterTheLoop) {
  ThreadPool pool(2);
  std::atomic<size_t> done{0};
  EXPECT_THROW(pool.parallel_for(100, [&](size_t b, size_t e) {
    if (b == 0) throw std::runtime_error("boom");
    done += e - b;
  }, 1), std::runtime_error);
  EXPECT_EQ(done.load(), 99u);  // every other range still ran, and the pool still works:
  pool.parallel_for(10, [&](size_t b, size_t e) { done += e - b; });
  EXPECT_EQ(done.load(), 109u);
}

TEST(ThreadPool, RefusesThreadCountsAboveTheBound) {
  try {
    ThreadPool pool(ThreadPool::max_threads() + 1);
    ADD_FAILURE() << "accepted " << ThreadPool::max_threads() + 1 << " threads";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("above the limit"), std::string::npos) << e.what();
  }
  EXPECT_GE(ThreadPool::max_threads(), 256);
}

// Regression: a thread that cannot be started inside the constructor (here: address space
// too small for its stack) used to leave the started workers waiting and hang. Run in a
// child process so the limit stays there; an alarm turns a hang into a failure.
TEST(ThreadPool, FailedThreadStartThrowsInsteadOfHanging) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(60);
    long pages = 0;
    std::ifstream("/proc/self/statm") >> pages;
    const rlim_t room = rlim_t(pages) * rlim_t(sysconf(_SC_PAGESIZE)) + (rlim_t(96) << 20);
    const rlimit lim{room, room};
    if (setrlimit(RLIMIT_AS, &lim) != 0) _exit(3);
    try {
      ThreadPool pool(200);  // 8 MiB stacks: far more than 96 MiB holds
      _exit(4);
    } catch (const Error& e) {
      _exit(std::string(e.what()).find("cannot start thread") != std::string::npos ? 0 : 5);
    } catch (...) {
      _exit(6);
    }
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "child killed by signal " << WTERMSIG(status) << " (14: hung)";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: setrlimit failed, 4: all threads started, 5/6: wrong error";
}

}  // namespace
}  // namespace vlm::kernels
