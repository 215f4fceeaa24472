// nn::attention against a plain float64 loop written from its definition (nn/attention.h):
// softmax(q·kᵀ · scale + mask) · v per query head, with q, k, v and the probabilities
// rounded to bf16 under Precision::Bf16. Shapes cover the vision tower's (d = 72, one KV head
// per head) and the decoder's (d = 256, two query heads per KV head), key counts off the
// 64-key panels, query rows across the 256-row blocks and the 24-row pieces, and masks with
// empty rows. nn::attention_decode against the same definition, one query row per sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/exec.h"
#include "kernels/matmul.h"
#include "nn/attention.h"

namespace vlm {
namespace {

using kernels::Exec;
using kernels::Isa;
using kernels::Precision;

constexpr float kBlocked = std::numeric_limits<float>::lowest();

// A dense [Lq, Lk] additive mask handed out as tiles.
class DenseMask : public nn::MaskTiles {
 public:
  DenseMask(size_t lq, size_t lk, std::vector<float> m) : lq_(lq), lk_(lk), m_(std::move(m)) {}
  void row_span(size_t q, size_t* lo, size_t* hi) const override {
    *lo = lk_, *hi = 0;
    for (size_t j = 0; j < lk_; ++j)
      if (m_[q * lk_ + j] != kBlocked) *lo = std::min(*lo, j), *hi = j + 1;
  }
  void tile(size_t q0, size_t q1, size_t k0, size_t k1, float* out) const override {
    for (size_t q = q0; q < q1; ++q)
      for (size_t j = k0; j < k1; ++j) *out++ = m_[q * lk_ + j];
  }
  float at(size_t q, size_t j) const { return m_[q * lk_ + j]; }

 private:
  size_t lq_, lk_;
  std::vector<float> m_;
};

struct Case {
  size_t Lq, Lk, heads, kv_heads, d;
};

std::vector<float> random(size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// The definition in float64; bf16 rounds q, k, v and (in f32) the probabilities.
std::vector<double> reference(const Case& c, const std::vector<float>& q, const std::vector<float>& k,
                              const std::vector<float>& v, const DenseMask* mask, float scale, bool bf16) {
  auto in = [&](float x) { return double(bf16 ? round_bf16(x) : x); };
  const size_t d = c.d, group = c.heads / c.kv_heads, qrow = c.heads * d, krow = c.kv_heads * d;
  std::vector<double> out(c.Lq * qrow, 0.0), s(c.Lk);
  for (size_t i = 0; i < c.Lq; ++i)
    for (size_t h = 0; h < c.heads; ++h) {
      const size_t g = h / group;
      double mx = -INFINITY;
      for (size_t j = 0; j < c.Lk; ++j) {
        double dot = 0;
        for (size_t t = 0; t < d; ++t) dot += in(q[i * qrow + h * d + t]) * in(k[j * krow + g * d + t]);
        s[j] = float(dot) * scale + (mask ? mask->at(i, j) : 0.f);
        if (mask && mask->at(i, j) == kBlocked) s[j] = -INFINITY;
        mx = std::max(mx, s[j]);
      }
      if (mx == -INFINITY) continue;  // no visible key: zeros
      double sum = 0;
      for (size_t j = 0; j < c.Lk; ++j) sum += s[j] = std::exp(s[j] - mx);
      for (size_t j = 0; j < c.Lk; ++j) {
        const double p = bf16 ? double(round_bf16(float(s[j] / sum))) : s[j] / sum;
        for (size_t t = 0; t < d; ++t) out[i * qrow + h * d + t] += p * in(v[j * krow + g * d + t]);
      }
    }
  return out;
}

// Causal with `offset` cached keys, and every row in `empty` seeing nothing.
DenseMask causal(size_t Lq, size_t Lk, std::vector<size_t> empty) {
  std::vector<float> m(Lq * Lk, 0.f);
  for (size_t i = 0; i < Lq; ++i)
    for (size_t j = 0; j < Lk; ++j)
      if (j > Lk - Lq + i || std::find(empty.begin(), empty.end(), i) != empty.end()) m[i * Lk + j] = kBlocked;
  return DenseMask(Lq, Lk, std::move(m));
}

struct Errors {
  double max = 0, frac_tight = 0;  // relative to max|ref|; share of cells within 1e-5 of it
};

Errors compare(const std::vector<float>& ours, const std::vector<double>& ref) {
  double top = 0;
  for (double r : ref) top = std::max(top, std::abs(r));
  Errors e;
  size_t tight = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double err = std::abs(double(ours[i]) - ref[i]) / top;
    e.max = std::max(e.max, err);
    tight += err <= 1e-5;
  }
  e.frac_tight = double(tight) / double(ref.size());
  return e;
}

std::vector<float> run(const Case& c, const std::vector<float>& q, const std::vector<float>& k,
                       const std::vector<float>& v, const DenseMask* mask, float scale, const Exec& ex) {
  std::vector<float> out(c.Lq * c.heads * c.d, 123.f);
  nn::AttnScratch sc;
  nn::attention(q.data(), c.Lq, k.data(), v.data(), c.Lk, mask, {c.heads, c.kv_heads, c.d, scale}, out.data(), sc, ex);
  return out;
}

const Case kCases[] = {
    {37, 100, 4, 4, 72},    // vision-like heads, keys off the panels
    {15, 300, 2, 2, 72},    // the same over several 128-key blocks of values, 4 + 4 + 4 + 3 rows
    {6, 130, 1, 1, 72},     // 4 + 2 rows
    {300, 300, 2, 1, 256},  // decoder-like GQA, rows across a 256-row block
    {5, 64, 3, 3, 16},      // one panel, fewer rows than a register tile
    {9, 70, 2, 2, 20},      // 4 value columns past the last whole vector of 16 (8 for d = 72)
    {7, 80, 1, 1, 26},      // 10 past it: more than the two-pair tail of the bf16 values holds
};

void check_paths(bool masked) {
  ThreadPool pool(2);
  std::mt19937 rng(7);
  // (ISA, Exec::bf16_gemm): on AVX512-BF16 Bf16 attention runs on the f32 panels with Fma, on bf16
  // pairs with the dot (Dot) or the tiles (Amx, and their scalar model AmxModel).
  using kernels::Bf16Gemm;
  std::vector<std::pair<Isa, Bf16Gemm>> paths = {{Isa::Scalar, Bf16Gemm::Fma}};
  if (kernels::isa_supported(Isa::Avx2)) paths.push_back({Isa::Avx2, Bf16Gemm::Fma});
  if (kernels::isa_supported(Isa::Avx512)) paths.push_back({Isa::Avx512, Bf16Gemm::Fma});
  if (kernels::bf16_dot_supported()) {
    paths.push_back({Isa::Avx512, Bf16Gemm::Dot});
    paths.push_back({Isa::Avx512, Bf16Gemm::AmxModel});
  }
  if (kernels::amx_supported()) paths.push_back({Isa::Avx512, Bf16Gemm::Amx});
  for (const Case& c : kCases) {
    const auto q = random(c.Lq * c.heads * c.d, rng, 1.f);
    const auto k = random(c.Lk * c.kv_heads * c.d, rng, 1.f);
    const auto v = random(c.Lk * c.kv_heads * c.d, rng, 1.f);
    const float scale = 1.f / std::sqrt(float(c.d));
    const DenseMask mask = causal(c.Lq, c.Lk, {0, c.Lq / 2});
    const DenseMask* m = masked ? &mask : nullptr;
    const auto exact = reference(c, q, k, v, m, scale, false);
    const auto rounded = reference(c, q, k, v, m, scale, true);
    for (auto [isa, gemm] : paths) {
      SCOPED_TRACE(testing::Message() << "Lq " << c.Lq << " Lk " << c.Lk << " d " << c.d << " isa "
                                      << kernels::isa_name(isa) << " " << kernels::bf16_gemm_name(gemm));
      const Errors f32 = compare(run(c, q, k, v, m, scale, Exec(pool, isa, Precision::F32)), exact);
      EXPECT_LT(f32.max, 1e-5);
      Exec bf(pool, isa, Precision::Bf16);
      bf.bf16_gemm = gemm;
      const auto ours = run(c, q, k, v, m, scale, bf);
      // A probability on a bf16 rounding boundary may round one step the other way (its f32
      // value differs from the float64 one in the last bits): a few cells move by up to
      // 2^-8 · p · |v|; the rest agree to f32 summation.
      const Errors bf16 = compare(ours, rounded);
      EXPECT_LT(bf16.max, 4e-3);
      EXPECT_GT(bf16.frac_tight, 0.97) << "max " << bf16.max;
      // ... and the rounding is there: the exact definition is far away.
      EXPECT_GT(compare(ours, exact).max, 1e-3);
      EXPECT_LT(compare(ours, exact).frac_tight, 0.5);
      if (masked)  // rows with no visible key are zeros
        for (size_t row : {size_t(0), c.Lq / 2})
          for (size_t t = 0; t < c.heads * c.d; ++t) ASSERT_EQ(ours[row * c.heads * c.d + t], 0.f);
    }
  }
}

TEST(Attention, EveryPathAndPrecisionMatchesTheDefinitionUnmasked) { check_paths(false); }
TEST(Attention, EveryPathAndPrecisionMatchesTheDefinitionMasked) { check_paths(true); }

// Unmasked keys in whole panels (the vision tower's 4096) take the f32 route's other softmax: the
// q·kᵀ tiles scale the scores and keep each row's maximum. It must give the bits of the masked
// route, which scales and finds the maximum in the softmax's own pass, under an all-zero mask.
TEST(Attention, UnmaskedWholePanelsGiveTheBitsOfAZeroMask) {
  ThreadPool pool(2);
  std::mt19937 rng(11);
  std::vector<Isa> isas = {Isa::Scalar};
  if (kernels::isa_supported(Isa::Avx2)) isas.push_back(Isa::Avx2);
  if (kernels::isa_supported(Isa::Avx512)) isas.push_back(Isa::Avx512);
  for (const Case& c : {Case{37, 128, 2, 2, 72}, Case{13, 256, 2, 1, 256}, Case{7, 192, 1, 1, 20}}) {
    const auto q = random(c.Lq * c.heads * c.d, rng, 2.f);
    const auto k = random(c.Lk * c.kv_heads * c.d, rng, 2.f);
    const auto v = random(c.Lk * c.kv_heads * c.d, rng, 1.f);
    const DenseMask zeros(c.Lq, c.Lk, std::vector<float>(c.Lq * c.Lk, 0.f));
    const float scale = 1.f / std::sqrt(float(c.d));
    for (Isa isa : isas)
      for (Precision p : {Precision::F32, Precision::Bf16}) {
        SCOPED_TRACE(testing::Message() << "Lk " << c.Lk << " d " << c.d << " isa " << kernels::isa_name(isa)
                                        << (p == Precision::Bf16 ? " bf16" : " f32"));
        Exec ex(pool, isa, p);
        ex.bf16_gemm = kernels::Bf16Gemm::Fma;  // the f32 panels
        const auto plain = run(c, q, k, v, nullptr, scale, ex), masked = run(c, q, k, v, &zeros, scale, ex);
        ASSERT_EQ(std::memcmp(plain.data(), masked.data(), plain.size() * sizeof(float)), 0);
        EXPECT_LT(compare(plain, reference(c, q, k, v, nullptr, scale, p == Precision::Bf16)).max, 4e-3);
      }
  }
}

// A sliding window (keys (i − 100, i]) over 520 rows: the second and third score blocks start
// their keys off the packed panels (k0 = 157 and 413), where attend's scores and P·v must line
// up with the packed keys and values.
TEST(Attention, SlidingWindowBlocksStartOffThePanels) {
  ThreadPool pool(2);
  std::mt19937 rng(13);
  const Case c{520, 520, 2, 1, 72};
  std::vector<float> m(c.Lq * c.Lk, 0.f);
  for (size_t i = 0; i < c.Lq; ++i)
    for (size_t j = 0; j < c.Lk; ++j)
      if (j > i || j + 100 <= i) m[i * c.Lk + j] = kBlocked;
  const DenseMask mask(c.Lq, c.Lk, std::move(m));
  const auto q = random(c.Lq * c.heads * c.d, rng, 1.f);
  const auto k = random(c.Lk * c.kv_heads * c.d, rng, 1.f);
  const auto v = random(c.Lk * c.kv_heads * c.d, rng, 1.f);
  const float scale = 1.f / std::sqrt(float(c.d));
  const auto exact = reference(c, q, k, v, &mask, scale, false);
  const auto rounded = reference(c, q, k, v, &mask, scale, true);
  std::vector<Isa> isas = {Isa::Scalar};
  if (kernels::isa_supported(Isa::Avx2)) isas.push_back(Isa::Avx2);
  if (kernels::isa_supported(Isa::Avx512)) isas.push_back(Isa::Avx512);
  for (Isa isa : isas) {
    SCOPED_TRACE(kernels::isa_name(isa));
    EXPECT_LT(compare(run(c, q, k, v, &mask, scale, Exec(pool, isa, Precision::F32)), exact).max, 1e-5);
    const Errors bf16 = compare(run(c, q, k, v, &mask, scale, Exec(pool, isa, Precision::Bf16)), rounded);
    EXPECT_LT(bf16.max, 4e-3);
    EXPECT_GT(bf16.frac_tight, 0.97) << "max " << bf16.max;
  }
  // Each bf16 route of AVX512-BF16 (the default above is one of them).
  using kernels::Bf16Gemm;
  for (Bf16Gemm gemm : {Bf16Gemm::Fma, Bf16Gemm::Dot, Bf16Gemm::Amx, Bf16Gemm::AmxModel}) {
    if (!kernels::bf16_dot_supported() || (gemm == Bf16Gemm::Amx && !kernels::amx_supported())) continue;
    SCOPED_TRACE(kernels::bf16_gemm_name(gemm));
    Exec bf(pool, Isa::Avx512, Precision::Bf16);
    bf.bf16_gemm = gemm;
    const Errors e = compare(run(c, q, k, v, &mask, scale, bf), rounded);
    EXPECT_LT(e.max, 4e-3);
    EXPECT_GT(e.frac_tight, 0.97) << "max " << e.max;
  }
}

// Packed keys and values hold one Exec's layout and rounding: attend refuses them under another
// precision, ISA or route (the bf16 pairs or the f32 panels), and a key range outside the packed
// keys.
TEST(Attention, PackedKeysAndValuesRefuseAnotherExec) {
  ThreadPool pool(1);
  const size_t n = 40, d = 8;
  std::vector<float> k(n * d, 0.5f), v(n * d, 0.25f), q(d, 1.f), out(d);
  kernels::PackedKv kv;
  const Exec f32(pool, Isa::Scalar, Precision::F32), bf16(pool, Isa::Scalar, Precision::Bf16);
  kernels::pack_kv(k.data(), v.data(), d, n, d, kv, f32);
  kernels::attend(q.data(), d, 1, kv, 0, n, 1.f, nullptr, 0, out.data(), d, f32);
  for (float o : out) EXPECT_NEAR(o, 0.25f, 1e-6f);  // equal scores: the mean of equal values
  EXPECT_THROW(kernels::attend(q.data(), d, 1, kv, 0, n, 1.f, nullptr, 0, out.data(), d, bf16), Error);
  EXPECT_THROW(kernels::attend(q.data(), d, 1, kv, 0, n + 1, 1.f, nullptr, 0, out.data(), d, f32), Error);
  EXPECT_THROW(kernels::attend(q.data(), d, 1, kv, 5, 5, 1.f, nullptr, 0, out.data(), d, f32), Error);
  if (kernels::isa_supported(Isa::Avx2)) {
    const Exec avx2(pool, Isa::Avx2, Precision::F32);
    EXPECT_THROW(kernels::attend(q.data(), d, 1, kv, 0, n, 1.f, nullptr, 0, out.data(), d, avx2), Error);
  }
  if (kernels::bf16_dot_supported()) {
    Exec dot(pool, Isa::Avx512, Precision::Bf16), fma(pool, Isa::Avx512, Precision::Bf16);
    Exec tiles(pool, Isa::Avx512, Precision::Bf16);
    dot.bf16_gemm = kernels::Bf16Gemm::Dot, fma.bf16_gemm = kernels::Bf16Gemm::Fma;
    tiles.bf16_gemm = kernels::Bf16Gemm::AmxModel;
    kernels::pack_kv(k.data(), v.data(), d, n, d, kv, dot);
    kernels::attend(q.data(), d, 1, kv, 0, n, 1.f, nullptr, 0, out.data(), d, dot);
    EXPECT_THROW(kernels::attend(q.data(), d, 1, kv, 0, n, 1.f, nullptr, 0, out.data(), d, fma), Error);
    EXPECT_THROW(kernels::attend(q.data(), d, 1, kv, 0, n, 1.f, nullptr, 0, out.data(), d, tiles), Error);
    kernels::pack_kv(k.data(), v.data(), d, n, d, kv, tiles);  // the tiles' layout: not the dot's
    kernels::attend(q.data(), d, 1, kv, 0, n, 1.f, nullptr, 0, out.data(), d, tiles);
    EXPECT_THROW(kernels::attend(q.data(), d, 1, kv, 0, n, 1.f, nullptr, 0, out.data(), d, dot), Error);
  }
}

// attention_decode: several rows of one step, each against its own cache, with key counts
// inside one 64-key chunk, on a chunk edge (256) and across several (the merge), last chunks of
// 1 to 60 keys (read in quarters and a tail), in f32 sums on every path, over f32 caches and bf16
// ones (against the definition on the bf16 values). Then each row alone on 16 threads, where its
// chunks split by KV heads: the same bits as all rows together on 2.
TEST(Attention, DecodeRowsMatchTheDefinitionOnEveryPath) {
  ThreadPool pool(2), wide(16);
  std::mt19937 rng(11);
  std::vector<Isa> paths = {Isa::Scalar};
  if (kernels::isa_supported(Isa::Avx2)) paths.push_back(Isa::Avx2);
  if (kernels::isa_supported(Isa::Avx512)) paths.push_back(Isa::Avx512);
  struct Shape {
    size_t heads, kv_heads, d;
  };
  const Shape shapes[] = {{8, 4, 256}, {4, 1, 256}, {6, 2, 72}, {3, 3, 20}};
  const size_t lengths[] = {1, 3, 37, 67, 256, 257, 700};  // chunks of 1-3 keys take no quarters
  for (const Shape& sh : shapes) {
    const float scale = 1.f / std::sqrt(float(sh.d));
    const nn::AttnShape shape{sh.heads, sh.kv_heads, sh.d, scale};
    std::vector<std::vector<float>> q, k, v;
    std::vector<std::vector<uint16_t>> kb, vb;  // the same keys and values as bf16
    std::vector<std::vector<double>> want, want_bf16;
    auto to_bf16 = [](const std::vector<float>& x) {
      std::vector<uint16_t> y(x.size());
      for (size_t i = 0; i < x.size(); ++i) y[i] = f32_to_bf16(x[i]);
      return y;
    };
    auto widen = [](const std::vector<uint16_t>& x) {
      std::vector<float> y(x.size());
      for (size_t i = 0; i < x.size(); ++i) y[i] = bf16_to_f32(x[i]);
      return y;
    };
    for (size_t n : lengths) {
      q.push_back(random(sh.heads * sh.d, rng, 1.f));
      k.push_back(random(n * sh.kv_heads * sh.d, rng, 1.f));
      v.push_back(random(n * sh.kv_heads * sh.d, rng, 1.f));
      kb.push_back(to_bf16(k.back()));
      vb.push_back(to_bf16(v.back()));
      const Case c{1, n, sh.heads, sh.kv_heads, sh.d};
      want.push_back(reference(c, q.back(), k.back(), v.back(), nullptr, scale, false));
      want_bf16.push_back(reference(c, q.back(), widen(kb.back()), widen(vb.back()), nullptr, scale, false));
    }
    for (Isa isa : paths)
      for (DType kv : {DType::F32, DType::BF16}) {
        SCOPED_TRACE(testing::Message() << "heads " << sh.heads << "/" << sh.kv_heads << " d " << sh.d << " isa "
                                        << kernels::isa_name(isa) << " cache " << dtype_name(kv));
        const bool bf16 = kv == DType::BF16;
        std::vector<std::vector<float>> out(std::size(lengths), std::vector<float>(sh.heads * sh.d, 123.f));
        std::vector<nn::DecodeRow> rows;
        for (size_t r = 0; r < std::size(lengths); ++r) {
          const void* kr = bf16 ? static_cast<const void*>(kb[r].data()) : k[r].data();
          const void* vr = bf16 ? static_cast<const void*>(vb[r].data()) : v[r].data();
          rows.push_back({q[r].data(), kr, vr, lengths[r], out[r].data()});
        }
        nn::AttnScratch sc;
        nn::attention_decode(rows, shape, kv, sc, Exec(pool, isa, Precision::Bf16));  // f32 sums at any precision
        for (size_t r = 0; r < std::size(lengths); ++r) {
          EXPECT_LT(compare(out[r], bf16 ? want_bf16[r] : want[r]).max, 5e-6) << "keys " << lengths[r];
          std::vector<float> alone(sh.heads * sh.d, 123.f);
          nn::DecodeRow row = rows[r];
          row.out = alone.data();
          nn::attention_decode({&row, 1}, shape, kv, sc, Exec(wide, isa, Precision::Bf16));
          EXPECT_EQ(0, std::memcmp(alone.data(), out[r].data(), alone.size() * sizeof(float))) << "keys " << lengths[r];
        }
      }
  }
}

}  // namespace
}  // namespace vlm
