#include "kernels/matmul.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/huge_pages.h"
#include "kernels/matmul_impl.h"
#include "kernels/ops.h"
#include "kernels/quant.h"
#include "kernels/simd_scalar.h"

namespace vlm::kernels {

Weight as_weight(const TensorView& t) {
  if (t.shape.size() != 2) fail("tensor {} is not 2-D", t.name);
  return Weight{t.data, t.dtype, size_t(t.shape[0]), size_t(t.shape[1])};
}

namespace {
// An f16 value that is also a bf16 value: a normal one has its three low mantissa bits zero (bf16
// keeps 7 of f16's 10), a subnormal one (m · 2^-24) at most 8 significant bits (bf16 holds it as a
// normal number); ±Inf and NaN count, as the tiles' pairs keep them whole in hi.
bool f16_in_bf16(uint16_t h) {
  const unsigned e = (h >> 10) & 31, m = h & 0x3FF;
  if (e) return e == 31 || (m & 7) == 0;
  return (m & (m >= 512 ? 3 : m >= 256 ? 1 : 0)) == 0;
}
}  // namespace

void mark_bf16_exact(Weight& w) {
  if (w.dtype != DType::F16) return;
  w.bf16_exact = false;
  for (size_t r = 0; r < w.rows; ++r) {
    const std::byte* row = w.data + r * w.stride_bytes();
    bool all = true;
    for (size_t c = 0; c < w.cols; ++c) {
      uint16_t h;
      std::memcpy(&h, row + 2 * c, 2);
      all &= f16_in_bf16(h);
    }
    if (!all) return;
  }
  w.bf16_exact = true;
}

Weight f32_weight(const float* data, size_t rows, size_t cols, size_t ld) {
  return Weight{reinterpret_cast<const std::byte*>(data), DType::F32, rows, cols, ld * 4};
}

namespace {
template <DType D>
void to_f32(const std::byte* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if constexpr (D == DType::F32) {
      std::memcpy(dst + i, src + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      dst[i] = D == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  }
}

template <DType D>
Format plain_format(const char* name, FormatKernels detail::IsaKernels::*member) {
  using detail::kernels_for;
  return Format{D, name, 1, dtype_size(D), &to_f32<D>, DType::F32, nullptr, true,
                {kernels_for(Isa::Scalar).*member, kernels_for(Isa::Avx2).*member,
                 kernels_for(Isa::Avx512).*member}};
}
template <GgmlType G>
void dequantize(const std::byte* src, float* dst, size_t n) {
  dequantize_row(G, src, dst, n);
}

// ggml's block formats: integer dot kernels on activations quantized per block (Q8Act, per 32;
// the K-quants Q8KAct, per 256), [N, K] layout only. Without AVX512-VNNI the Avx512 row runs
// the AVX2 kernels. Where a bf16 GEMM is the faster route (Exec::bf16_gemm Dot or Amx), a
// Precision::Bf16 product of more rows than it takes dequantizes the weights into it instead
// (gemm_bf16dot_rounded, gemm_amx_rounded).
template <GgmlType G>
Format block_format(const char* name, FormatKernels detail::QuantKernels::*member, size_t dot_rows) {
  using namespace detail;
  FormatKernels wide = (quant_vnni_supported() ? kQuantAvx512 : kQuantAvx2).*member;
  if (bf16_dot_supported()) {
    wide.gemm_bf16 = &gemm_bf16dot_rounded;
    wide.gemm_amx = &gemm_amx_rounded;
    wide.dot_amx = &dot_amx_rounded;
  }
  return Format{dtype_of(G), name, size_t(ggml_traits(G).block_elems), ggml_traits(G).block_bytes,
                &dequantize<G>, takes_q8k(G) ? DType::Q8KAct : DType::Q8Act, nullptr, false,
                {kQuantScalar.*member, kQuantAvx2.*member, wide}, dot_rows};
}

// An activation row's values d·q: per 32 (Q8Act) or 256 (Q8KAct) values one scale.
template <size_t B>
void act_to_f32(const std::byte* src, float* dst, size_t n) {
  const auto r = [&] {
    if constexpr (B == 32) return q8_row(src, n);
    else return q8k_row(src, n);
  }();
  for (size_t i = 0; i < n; ++i) dst[i] = r.d[i / B] * float(r.q[i]);
}
}  // namespace

const Format& format_of(DType type) {
  using K = detail::IsaKernels;
  using Q = detail::QuantKernels;
  static const Format f32 = plain_format<DType::F32>("f32", &K::f32);
  static const Format f16 = plain_format<DType::F16>("f16", &K::f16);
  static const Format bf16 = plain_format<DType::BF16>("bf16", &K::bf16);
  // The rows up to which each format's int8 kernels ran at least 5 % faster than dequantizing
  // into the bf16 GEMM: one 10240 x 2560 product, both routes in turn, Zen 5 (docs/gguf.md,
  // "Prefill on the bf16 dot").
  static const Format q8_0 = block_format<GgmlType::Q8_0>("q8_0", &Q::q8_0, 96);
  static const Format q4_0 = block_format<GgmlType::Q4_0>("q4_0", &Q::q4_0, 128);
  static const Format q4_1 = block_format<GgmlType::Q4_1>("q4_1", &Q::q4_1, 128);
  static const Format q5_0 = block_format<GgmlType::Q5_0>("q5_0", &Q::q5_0, 96);
  static const Format q5_1 = block_format<GgmlType::Q5_1>("q5_1", &Q::q5_1, 96);
  static const Format q2_k = block_format<GgmlType::Q2_K>("q2_k", &Q::q2_k, 384);
  static const Format q3_k = block_format<GgmlType::Q3_K>("q3_k", &Q::q3_k, 256);
  static const Format q4_k = block_format<GgmlType::Q4_K>("q4_k", &Q::q4_k, 512);
  static const Format q5_k = block_format<GgmlType::Q5_K>("q5_k", &Q::q5_k, 192);
  static const Format q6_k = block_format<GgmlType::Q6_K>("q6_k", &Q::q6_k, 128);
  static const Format iq4_nl = block_format<GgmlType::IQ4_NL>("iq4_nl", &Q::iq4_nl, 192);
  static const Format iq4_xs = block_format<GgmlType::IQ4_XS>("iq4_xs", &Q::iq4_xs, 256);
  // Activations only: no weight kernels.
  static const Format q8act{DType::Q8Act, "q8_act", 32, kQ8BlockBytes, &act_to_f32<32>, DType::F32,
                            &quantize_activations, false, {}};
  static const Format q8kact{DType::Q8KAct, "q8_k_act", 256, kQ8KBlockBytes, &act_to_f32<256>, DType::F32,
                             &quantize_activations_k, false, {}};
  switch (type) {
    case DType::F32: return f32;
    case DType::F16: return f16;
    case DType::BF16: return bf16;
    case DType::Q8_0: return q8_0;
    case DType::Q4_0: return q4_0;
    case DType::Q4_1: return q4_1;
    case DType::Q5_0: return q5_0;
    case DType::Q5_1: return q5_1;
    case DType::Q2_K: return q2_k;
    case DType::Q3_K: return q3_k;
    case DType::Q4_K: return q4_k;
    case DType::Q5_K: return q5_k;
    case DType::Q6_K: return q6_k;
    case DType::IQ4_NL: return iq4_nl;
    case DType::IQ4_XS: return iq4_xs;
    case DType::Q8Act: return q8act;
    case DType::Q8KAct: return q8kact;
  }
  fail("matmul: no kernels for weight format {}", int(type));
}

void matmul_ref(const float* x, size_t M, const Weight& w, float* y, Precision precision) {
  const bool bf16 = precision == Precision::Bf16;
  const Format& f = format_of(w.dtype);
  const size_t K = w.cols, N = w.rows;
  std::vector<float> row(K);
  for (size_t n = 0; n < N; ++n) {
    f.to_f32(w.data + n * w.stride_bytes(), row.data(), K);
    for (size_t m = 0; m < M; ++m) {
      const float* xm = x + m * K;
      float acc = 0.f;
      for (size_t k = 0; k < K; ++k) acc += (bf16 ? round_bf16(xm[k]) : xm[k]) * row[k];
      y[m * N + n] = acc;
    }
  }
}

namespace detail {
const IsaKernels kScalarKernels = make_kernels<S1>("scalar");

const IsaKernels& kernels_for(Isa isa) {
  switch (isa) {
    case Isa::Avx512: return kAvx512Kernels;
    case Isa::Avx2: return kAvx2Kernels;
    case Isa::Scalar: break;
  }
  return kScalarKernels;
}
}  // namespace detail

namespace {

using detail::GemmArgs;
using detail::IsaKernels;

float* pack_buffer(size_t floats) {
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  thread_local std::unique_ptr<float, Free> buf;
  thread_local size_t have = 0;
  if (have < floats) {
    buf.reset(static_cast<float*>(std::aligned_alloc(64, (floats * 4 + 63) / 64 * 64)));
    if (!buf) fail("matmul: out of memory for a {} KiB packing buffer", floats * 4 / 1024);
    have = floats;
  }
  return buf.get();
}

// x rounded to bf16 (nearest even), dense [M, K], in a per-thread buffer; rows spread over
// the pool (on one thread the rounding of a 4096-row vision x took 2 % of an image's time while
// the other core waited).
const float* rounded_x(const GemmArgs& a, const Exec& ex) {
  thread_local std::vector<float> buf;
  buf.resize(a.M * a.K);
  float* out = buf.data();
  ex.threads().parallel_for(a.M, [&](size_t m0, size_t m1) {
    for (size_t m = m0; m < m1; ++m) round_to_bf16(a.x + m * a.ldx, out + m * a.K, a.K, ex.isa);
  }, std::max<size_t>(1, (size_t(16) << 10) / std::max<size_t>(1, a.K)));
  return out;
}

// x rows as bf16 (nearest even) in a.xq, each padded with zeros to whole 64-byte vectors,
// in a per-thread buffer (FormatKernels::dot_bf16 and gemm_bf16): converted once per call,
// rows spread over the pool. x starts at the weights' offset within a 64-byte line (to a
// multiple of 4 bytes), so the dot kernels can load whole lines of both (aligning_lead); rows past
// M up to a multiple of four are zeros (dot_bf16 may take them as the last of a group). Only
// AVX512-BF16 CPUs take this path, so the conversion is the AVX512 one (0.9 → 0.2 ns a value
// against f32_to_bf16 in a loop: 3.8 % of an image's time on the Zen 5 VM before).
void bf16_x(GemmArgs& a, ThreadPool& pool) {
  thread_local std::vector<uint16_t> buf;
  const size_t ld = (a.K + 31) / 32 * 32;
  buf.resize((a.M + 3) / 4 * 4 * ld + 64);
  const uintptr_t line = (reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t(63);
  uint16_t* out = reinterpret_cast<uint16_t*>(line + (reinterpret_cast<uintptr_t>(a.w) & 60));
  pool.parallel_for(a.M, [&](size_t m0, size_t m1) {
    for (size_t m = m0; m < m1; ++m) {
      to_bf16(a.x + m * a.ldx, out + m * ld, a.K, Isa::Avx512);
      std::fill(out + m * ld + a.K, out + (m + 1) * ld, uint16_t(0));
    }
  }, std::max<size_t>(1, (size_t(16) << 10) / ld));
  std::fill(out + a.M * ld, out + (a.M + 3) / 4 * 4 * ld, uint16_t(0));  // the padding rows
  a.xq = reinterpret_cast<const std::byte*>(out);
  a.ldxq = 2 * ld;
}

// x for the tiles' GEMM (FormatKernels::gemm_amx) as whole A tiles, 16 rows × 32 values as bf16
// (nearest even), 1 KiB each on a line: a group of 16 rows' tiles one after another along K
// (a.ldxq bytes a group), zero past K and past M up to whole 32-row pairs of groups (the tiles
// read x 32 rows at a time), so that a tile is one contiguous read (with x's rows as rows, a
// tile's 16 rows a row apart, the products ran at a third of their rate; docs/gguf.md, "Prefill on
// AMX tiles"). f16 weights on the tiles take each x value twice, as a pair
// (gemm_amx_f16: a product over 2K values), unless their values are bf16 values
// (GemmArgs::bf16_exact). Groups spread over the pool.
void tile_x(GemmArgs& a, ThreadPool& pool) {
  thread_local HugePageVector<uint16_t> buf;
  const bool pairs = a.dtype == DType::F16 && !a.bf16_exact;
  const size_t n = pairs ? 2 * a.K : a.K, steps = (n + 31) / 32;
  const size_t groups = (a.M + detail::kAmxTileRows - 1) / detail::kAmxTileRows * (detail::kAmxTileRows / 16);
  buf.resize(groups * steps * 512);
  uint16_t* out = buf.data();
  pool.parallel_for(groups, [&](size_t g0, size_t g1) {
    thread_local std::vector<uint16_t> row, half;
    row.resize(steps * 32);
    for (size_t g = g0; g < g1; ++g)
      for (size_t r = 0; r < 16; ++r) {
        const size_t m = 16 * g + r;
        std::fill(row.begin() + (m < a.M ? n : 0), row.end(), uint16_t(0));  // past x's values
        if (m < a.M && pairs) {
          half.resize(a.K);
          to_bf16(a.x + m * a.ldx, half.data(), a.K, Isa::Avx512);
          for (size_t k = 0; k < a.K; ++k) row[2 * k] = row[2 * k + 1] = half[k];
        } else if (m < a.M) {
          to_bf16(a.x + m * a.ldx, row.data(), a.K, Isa::Avx512);
        }
        for (size_t s = 0; s < steps; ++s) std::memcpy(out + (g * steps + s) * 512 + 32 * r, row.data() + 32 * s, 64);
      }
  }, std::max<size_t>(1, (size_t(64) << 10) / (steps * 1024)));
  a.xq = reinterpret_cast<const std::byte*>(out);
  a.ldxq = steps * 1024;
}

// x for FormatKernels::dot_amx, the tiles' B operand: [pairs][cols] 32-bit words, cols 16, 32 or 64
// (whole tiles of x rows), word (p, m) the pair x[m][2p], x[m][2p + 1] as bf16 (nearest even), zero
// past K and M, whole 16-pair steps; in a per-thread buffer, pair rows spread over the pool.
void pair_x(GemmArgs& a, ThreadPool& pool) {
  thread_local std::vector<uint32_t> buf;
  const size_t cols = a.M > 32 ? 64 : a.M > 16 ? 32 : 16, pairs = (a.K + 31) / 32 * 16;
  buf.resize(pairs * cols + 16);
  uint32_t* out = reinterpret_cast<uint32_t*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t(63));
  pool.parallel_for(pairs, [&](size_t p0, size_t p1) {
    thread_local std::vector<uint16_t> row;
    row.assign(2 * (p1 - p0), 0);  // past K: stays zero for every m
    std::fill(out + p0 * cols, out + p1 * cols, 0u);
    const size_t k0 = std::min(2 * p0, a.K), k1 = std::min(2 * p1, a.K);
    for (size_t m = 0; m < a.M && k0 < k1; ++m) {
      to_bf16(a.x + m * a.ldx + k0, row.data(), k1 - k0, Isa::Avx512);
      for (size_t p = p0; p < p1; ++p)
        out[p * cols + m] = uint32_t(row[2 * (p - p0)]) | uint32_t(row[2 * (p - p0) + 1]) << 16;
    }
  }, 256);
  a.xq = reinterpret_cast<const std::byte*>(out);
  a.ldxq = 4 * cols;
}

// x rows rounded to bf16 as f32 in a.xq for FormatKernels::dot_bf16_fma: in 32-value groups
// from `shift` zeros on (fma_dot_shift), each group's even entries, then its odd ones (how a
// bf16 weight vector widens in two exact halves), rows zero-padded to whole groups, 64-byte
// aligned, in a per-thread buffer; rows spread over the pool, as in bf16_x.
void wide_x(GemmArgs& a, const Exec& ex) {
  thread_local std::vector<float> buf;
  const size_t shift = fma_dot_shift(a), ld = (a.K + shift + 31) / 32 * 32;
  buf.resize(a.M * ld + 16);
  float* out = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t(63));
  ex.threads().parallel_for(a.M, [&](size_t m0, size_t m1) {
    thread_local std::vector<float> row;  // one row rounded (by the ISA's kernel), from `shift` zeros on
    row.assign(ld, 0.f);
    for (size_t m = m0; m < m1; ++m) {
      round_to_bf16(a.x + m * a.ldx, row.data() + shift, a.K, ex.isa);
      float* o = out + m * ld;
      for (size_t g = 0; g < ld; g += 32)
        for (size_t i = 0; i < 16; ++i) {
          o[g + i] = row[g + 2 * i];
          o[g + 16 + i] = row[g + 2 * i + 1];
        }
    }
  }, std::max<size_t>(1, (size_t(8) << 10) / ld));
  a.xq = reinterpret_cast<const std::byte*>(out);
  a.ldxq = ld * sizeof(float);
}

// x rows in the activation format `act`, in a per-thread buffer.
void convert_x(GemmArgs& a, const Format& act) {
  if (!act.from_f32) fail("matmul: format {} cannot hold activations", act.name);
  // Rows on 64-byte lines, so the kernels' 32-byte loads of the codes never split a line.
  thread_local std::vector<std::byte> buf;
  a.ldxq = (act.row_bytes(a.K) + 63) / 64 * 64;
  buf.resize(a.M * a.ldxq + 64);
  std::byte* out = buf.data() + (-reinterpret_cast<uintptr_t>(buf.data()) & 63);
  for (size_t m = 0; m < a.M; ++m) act.from_f32(a.x + m * a.ldx, out + m * a.ldxq, a.K);
  a.xq = out;
  if (a.M == 1) return;
  if (act.type == DType::Q8KAct) {
    if (a.dtype != DType::Q4_K && a.dtype != DType::Q5_K && a.dtype != DType::IQ4_XS) return;
    thread_local std::vector<int16_t> s32;
    const size_t ng = a.K / 32;
    s32.resize(a.M * ng);
    for (size_t m = 0; m < a.M; ++m) {
      const int16_t* bs = q8k_row(a.xq + m * a.ldxq, a.K).bsums;  // at most 32·127 each
      for (size_t g = 0; g < ng; ++g) s32[m * ng + g] = int16_t(bs[2 * g] + bs[2 * g + 1]);
    }
    a.xs32 = s32.data();
    return;
  }
  if (act.type != DType::Q8Act) return;
  // The code sums (GemmArgs::xs4) meet Q4_0's and Q5_0's offsets, the m of Q4_1 and Q5_1, and the
  // 128 that the lane tiles of Q8_0 and IQ4_NL add to their weights.
  const bool sums = a.dtype == DType::Q4_0 || a.dtype == DType::Q4_1 || a.dtype == DType::Q5_0 || a.dtype == DType::Q5_1 ||
                    a.dtype == DType::Q8_0 || a.dtype == DType::IQ4_NL;
  thread_local std::vector<float> d4;
  thread_local std::vector<int32_t> s4;
  const size_t nb = a.K / 32;
  d4.assign((a.M + 3) / 4 * nb * 4, 0.f);
  s4.assign(sums ? d4.size() : 0, 0);
  for (size_t m = 0; m < a.M; ++m) {
    const Q8Row r = q8_row(a.xq + m * a.ldxq, a.K);
    const size_t g = m / 4 * nb * 4 + m % 4;
    for (size_t i = 0; i < nb; ++i) {
      d4[g + 4 * i] = r.d[i];
      if (sums)
        for (size_t j = 0; j < 32; ++j) s4[g + 4 * i] += r.q[32 * i + j];
    }
  }
  a.xd4 = d4.data();
  a.xs4 = sums ? s4.data() : nullptr;
}

// Which kernels a product takes: its format's kernels on the Exec's ISA, the dot route or the GEMM,
// and on AVX512-BF16 the native bf16 kernels (the AMX tiles among them) or their FMA twin.
struct Route {
  const FormatKernels* fk;
  bool use_dot, native, fma_dot, amx, amx_dot;
};

// The most rows the dot route takes where the AMX tiles could: at 32 the bf16 dot still streams
// every weight row once per product (format.h, dot_rows); past it the tiles do the products at many
// times the FMAs' rate, for every format (not measured per format, as dot_rows is for Dot).
constexpr size_t kAmxRows = 32;

// Whether the Exec asks for the tiles (Amx, or their model AmxModel); a vlm::Error when it asks for
// tiles this process does not have.
bool wants_tiles(const Exec& ex, const char* what) {
  if (ex.bf16_gemm == Bf16Gemm::Amx && !amx_supported())
    fail("{}: this CPU (or kernel) does not give AMX tiles to this process", what);
  return ex.bf16_gemm == Bf16Gemm::Amx || ex.bf16_gemm == Bf16Gemm::AmxModel;
}

Route route_of(const GemmArgs& a, const Exec& ex) {
  const Format& f = format_of(a.dtype);
  const FormatKernels& fk = f.isa[int(ex.isa)];
  if (!fk.dot) fail("matmul: no {} kernels for {} weights", isa_name(ex.isa), f.name);
  // The AVX512-BF16 kernels take x as bf16, rounded here once (bf16_x; tile_x for the tiles).
  // Otherwise, under Precision::Bf16, f32-activation formats get x rounded to bf16 and kept in
  // f32 (the same exact products on f32 FMAs), and block formats quantize x per block as at f32.
  const bool hw_bf16 = ex.precision == Precision::Bf16 && !a.kn && bf16_dot_supported();
  // Past the format's dot_rows (Amx: kAmxRows) a bf16 GEMM runs only where it is the faster
  // route (Exec::bf16_gemm Dot or Amx). Elsewhere f32/f16/bf16 weights widen into the f32 GEMM
  // and the block formats, which have none, stay on their int8 kernels: against the bf16 GEMM's
  // FMA twin those ran 1.2-1.65x faster, Q6_K 8 % slower before its lane tiles (M = 512, an
  // Intel VM; docs/gguf.md, "Prefill on the bf16 dot").
  const bool amx = hw_bf16 && wants_tiles(ex, "matmul") && fk.gemm_amx != nullptr;
  // f16 weights take the bf16 dot's GEMM only when their values are bf16 values; the tiles take any,
  // as (hi, lo) pairs where they are not (gemm_amx_f16).
  const bool as_bf16 = a.dtype != DType::F16 || a.bf16_exact;
  const bool gemm_bf16 = amx || (hw_bf16 && ex.bf16_gemm == Bf16Gemm::Dot && fk.gemm_bf16 != nullptr && as_bf16);
  // On the Dot route the bf16 dot takes up to kBf16DotRows rows: it reads the weights as they are,
  // where the bf16 GEMM packs them for every call (docs/performance.md, "the bf16 dot up to 64 rows").
  const bool dot_bf16 = hw_bf16 && ex.bf16_gemm == Bf16Gemm::Dot && fk.dot_bf16 != nullptr;
  const size_t dot_rows = amx && fk.dot_amx ? detail::kAmxDotRows
                          : amx           ? std::min(f.dot_rows, kAmxRows)
                          : dot_bf16      ? detail::kBf16DotRows
                                          : f.dot_rows;
  const bool use_dot = !a.kn && (a.M <= dot_rows || !(fk.gemm || gemm_bf16));
  const bool native = hw_bf16 && (use_dot ? fk.dot_bf16 != nullptr : gemm_bf16);
  // The dot's FMA twin: past four rows where vdpbf16ps is the slower (the dot is compute-bound
  // there), and on AVX2 from two rows, where the generic tile widens each weight vector again
  // for every pair of rows (four rows: 9 GB/s of weights against 15 on Zen 3). The AVX512 twin
  // needs the AVX512-BF16 CPU its file is built for.
  const bool fma_dot = use_dot && fk.dot_bf16_fma &&
                       (native ? ex.bf16_gemm != Bf16Gemm::Dot && a.M > 4
                               : ex.precision == Precision::Bf16 && ex.isa == Isa::Avx2 && a.M > 1);
  // On the tiles, 6..kAmxDotRows rows of bf16 weights take them as the A operand (dot_amx): from 6
  // rows on the tiles' fewer products beat the FMA twin's, and up to 64 the packing of the GEMM
  // costs more than the products (docs/gguf.md, "Few rows on AMX tiles").
  // Block formats keep their int8 kernels up to kAmxRows: dequantizing onto the tiles was 2.3-2.8x
  // slower at 8 rows, no faster at 32 (docs/gguf.md, "Few rows on AMX tiles").
  const bool amx_dot = amx && use_dot && a.M >= (f.block > 1 ? kAmxRows + 1 : kAmxDotMinRows) && fk.dot_amx != nullptr;
  return Route{&fk, use_dot, native, fma_dot && !amx_dot, amx && !use_dot, amx_dot};
}

// x in the form the route's kernels take.
void prepare_x(GemmArgs& a, const Route& r, const Exec& ex) {
  const Format& f = format_of(a.dtype);
  a.tiles_model = ex.bf16_gemm == Bf16Gemm::AmxModel;
  if (r.amx_dot) {
    pair_x(a, ex.threads());
  } else if (r.fma_dot) {
    wide_x(a, ex);
  } else if (r.native) {
    r.amx ? tile_x(a, ex.threads()) : bf16_x(a, ex.threads());
  } else if (f.act != DType::F32) {
    convert_x(a, format_of(f.act));
  } else if (ex.precision == Precision::Bf16) {
    a.x = rounded_x(a, ex);
    a.ldx = a.K;
  }
}

// The dot route over the rows of one or more products that share x (prepared once), numbered
// one after another, in chunks over the pool.
void run_dots(std::span<const GemmArgs> parts, const Route& r, const Exec& ex) {
  auto* dot = r.amx_dot ? r.fk->dot_amx : r.fma_dot ? r.fk->dot_bf16_fma : r.native ? r.fk->dot_bf16 : r.fk->dot;
  ThreadPool& pool = ex.threads();
  size_t rows = 0;
  for (const GemmArgs& p : parts) rows += p.N;
  // Guided ranges of at least 64 rows: each a long sequential stream, and the threads finish
  // a product together (docs/performance.md, "Guided ranges").
  pool.parallel_for(rows, [&](size_t n0, size_t n1) {
    size_t first = 0;  // the parts' first rows in the numbering
    for (const GemmArgs& p : parts) {
      const size_t b = std::max(n0, first), e = std::min(n1, first + p.N);
      if (b < e) dot(p, b - first, e - first);
      first += p.N;
    }
  }, 64, ThreadPool::Split::Guided);
}

void run(GemmArgs a, const Exec& ex) {
  if (a.M == 0 || a.N == 0) return;
  if (a.K == 0) {
    for (size_t m = 0; m < a.M; ++m)
      for (size_t n = 0; n < a.N; ++n) a.y[m * a.ldy + n] = a.bias ? a.bias[n] : 0.f;
    return;
  }
  const Route r = route_of(a, ex);
  prepare_x(a, r, ex);
  if (r.use_dot) return run_dots({&a, 1}, r, ex);
  const IsaKernels& k = detail::kernels_for(ex.isa);
  auto* gemm = r.amx ? r.fk->gemm_amx : r.native ? r.fk->gemm_bf16 : r.fk->gemm;
  ThreadPool& pool = ex.threads();
  const size_t threads = size_t(pool.size());
  const size_t panels = (a.N + k.panel - 1) / k.panel;
  // Tasks are column panels × row blocks; a task packs the weight of its own panels only, so a
  // block keeps at least kBlockRows rows to spread that packing over. Row blocks are added
  // (halving the rows) until there are 4 tasks per thread: q of a 256-row prefill (N = 2048, 32
  // panels) runs at 16 threads as 2 blocks × 32 panels. Splitting rows alone had every thread
  // pack the whole weight for its 16 rows, and 16 threads prefilled slower than 8
  // (docs/performance.md, "Threads: 4 to 16"). On the tiles a block also keeps at most
  // kAmxBlockRows rows, so that its x and its sums over a K block stay in L2 while the task's
  // panels go by: the vision tower's 4096 rows in one block streamed them from L3 (an image 9.4 s
  // against 7.5-8.2 s in blocks of 512 rows on a 2-core Xeon; docs/gguf.md, "Prefill on AMX tiles").
  constexpr size_t kBlockRows = 64, kAmxBlockRows = 512;
  size_t blocks = 1;
  while ((panels * blocks < 4 * threads || (r.amx && a.M / blocks > kAmxBlockRows)) &&
         a.M / (2 * blocks) >= kBlockRows)
    blocks *= 2;
  const size_t tile = r.amx ? detail::kAmxTileRows : k.row_tile, rows = (a.M + blocks - 1) / blocks;
  const size_t block_rows = (rows + tile - 1) / tile * tile;  // whole register tiles
  pool.parallel_for(panels * blocks, [&](size_t j0, size_t j1) {
    float* pack = pack_buffer(k.pack_floats);
    for (size_t j = j0; j < j1;) {  // task j: block j / panels, panel j % panels
      const size_t b = j / panels, p0 = j % panels, p1 = std::min(panels, p0 + (j1 - j));
      const size_t m0 = b * block_rows, m1 = std::min(a.M, m0 + block_rows);
      if (m0 < m1) gemm(a, p0 * k.panel, std::min(p1 * k.panel, a.N), m0, m1, pack);
      j += p1 - p0;
    }
  });
}

// A product's arguments, its shapes and strides checked.
GemmArgs args_of(const float* x, size_t ldx, size_t M, const Weight& w, Layout layout, const float* bias, float* y,
                 size_t ldy) {
  const bool kn = layout == Layout::KN;
  const Format& f = format_of(w.dtype);
  const size_t K = kn ? w.rows : w.cols, N = kn ? w.cols : w.rows;
  if (w.cols % f.block) fail("matmul: {} columns of a {} weight are not whole blocks of {}", w.cols, f.name, f.block);
  if (kn && !f.kn) fail("matmul: {} weights have no [K, N] layout kernels", f.name);
  const size_t dense = f.row_bytes(w.cols);
  if (w.stride_bytes() < dense || (M > 1 && ldx < K) || (M > 1 && ldy < N))
    fail("matmul: row stride below row length (w {} < {} bytes, x {} < {} or y {} < {})", w.stride_bytes(),
         dense, ldx, K, ldy, N);
  GemmArgs a{x, ldx, M, w.data, w.dtype, w.stride_bytes(), kn, K, N, bias, y, ldy};
  a.bf16_exact = w.dtype == DType::F16 && w.bf16_exact;
  return a;
}

}  // namespace

void matmul_strided(const float* x, size_t ldx, size_t M, const Weight& w, Layout layout,
                    const float* bias, float* y, size_t ldy, const Exec& ex) {
  run(args_of(x, ldx, M, w, layout, bias, y, ldy), ex);
}

void matmul_each(const float* x, size_t M, std::span<const Product> products, const Exec& ex) {
  // One loop needs one route and one prepared x: the same format, K and offset in a 64-byte line
  // (bf16_x and wide_x place x by the weights' offset), on the dot route.
  constexpr size_t kMaxParts = 4;
  std::array<GemmArgs, kMaxParts> parts;
  const size_t n = products.size();
  auto line_offset = [](const std::byte* p) { return reinterpret_cast<uintptr_t>(p) & 63; };
  bool together = n >= 2 && n <= kMaxParts && M > 0;
  for (size_t i = 0; together && i < n; ++i) {
    const Weight& w = products[i].w;
    const GemmArgs& a = parts[i] = args_of(x, w.cols, M, w, Layout::NK, nullptr, products[i].y, w.rows);
    together = a.K > 0 && a.N > 0 && a.dtype == parts[0].dtype && a.K == parts[0].K &&
               line_offset(a.w) == line_offset(parts[0].w);
  }
  const Route r = together ? route_of(parts[0], ex) : Route{};
  if (!together || !r.use_dot) {
    for (const Product& p : products) matmul(x, M, p.w, p.y, ex);
    return;
  }
  prepare_x(parts[0], r, ex);
  for (size_t i = 1; i < n; ++i) {
    GemmArgs& a = parts[i];
    a.x = parts[0].x, a.ldx = parts[0].ldx, a.xq = parts[0].xq, a.ldxq = parts[0].ldxq;
    a.xd4 = parts[0].xd4, a.xs4 = parts[0].xs4, a.xs32 = parts[0].xs32, a.tiles_model = parts[0].tiles_model;
  }
  run_dots({parts.data(), n}, r, ex);
}

void matmul(const float* x, size_t M, const Weight& w, float* y, const Exec& ex) {
  matmul_strided(x, w.cols, M, w, Layout::NK, nullptr, y, w.rows, ex);
}

void matmul_bias(const float* x, size_t M, const Weight& w, const float* bias, float* y,
                 const Exec& ex) {
  matmul_strided(x, w.cols, M, w, Layout::NK, bias, y, w.rows, ex);
}

void matmul_kn(const float* x, size_t M, const Weight& w, float* y, const Exec& ex) {
  matmul_strided(x, w.rows, M, w, Layout::KN, nullptr, y, w.cols, ex);
}

namespace {
// Feature bits that clang 14's __builtin_cpu_supports does not know (f16c, avx512bf16).
bool cpuid_bit(unsigned leaf, unsigned subleaf, int reg, unsigned bit) {
  unsigned r[4] = {0, 0, 0, 0};
  if (!__get_cpuid_count(leaf, subleaf, &r[0], &r[1], &r[2], &r[3])) return false;
  return (r[reg] >> bit) & 1u;
}
bool has_f16c() { return cpuid_bit(1, 0, 2, 29); }         // CPUID.1:ECX[29]
bool has_avx512bf16() { return cpuid_bit(7, 1, 0, 5); }  // CPUID.(7,1):EAX[5]
}  // namespace

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return true;
    case Isa::Avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    case Isa::Avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }
  return false;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Avx512: return "avx512";
    case Isa::Avx2: return "avx2";
    case Isa::Scalar: break;
  }
  return "scalar";
}

Isa best_isa() {
  static const Isa best = isa_supported(Isa::Avx512) ? Isa::Avx512
                          : isa_supported(Isa::Avx2) ? Isa::Avx2
                                                     : Isa::Scalar;
  return best;
}

Isa parse_isa(std::string_view name, std::string_view what) {
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512})
    if (name == isa_name(isa)) {
      if (!isa_supported(isa)) fail("{}={}: this CPU does not support it (best: {})", what, name, isa_name(best_isa()));
      return isa;
    }
  fail("{}={}: expected scalar, avx2 or avx512", what, name);
}

const char* precision_name(Precision p) { return p == Precision::Bf16 ? "bf16" : "f32"; }

Precision parse_precision(std::string_view name, std::string_view what) {
  if (name == "f32") return Precision::F32;
  if (name == "bf16") return Precision::Bf16;
  fail("{} {}: expected f32 or bf16", what, name);
}

bool bf16_dot_supported() {
  static const bool ok = isa_supported(Isa::Avx512) && has_avx512bf16();
  return ok;
}

bool amx_supported() {
  static const bool ok = [] {
    // CPUID.(7,0):EDX[22] AMX-BF16, [24] AMX-TILE; then the tile data state for this process
    // (Linux 5.16+; Documentation/arch/x86/xstate.rst): ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA.
    if (!bf16_dot_supported() || !cpuid_bit(7, 0, 3, 22) || !cpuid_bit(7, 0, 3, 24)) return false;
    constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
  }();
  return ok;
}

const char* bf16_gemm_name(Bf16Gemm g) {
  switch (g) {
    case Bf16Gemm::Dot: return "dot";
    case Bf16Gemm::Amx: return "amx";
    case Bf16Gemm::AmxModel: return "amx-model";
    case Bf16Gemm::Fma: break;
  }
  return "fma";
}

Bf16Gemm fastest_bf16_gemm() {
  static const Bf16Gemm fastest = [] {
    if (!bf16_dot_supported()) return Bf16Gemm::Fma;
    if (amx_supported()) return Bf16Gemm::Amx;
    // Products per second of each loop on this thread, best of five short runs (the two
    // differ by 2× either way on the CPUs measured, far beyond a run's noise).
    auto rate = [](double (*loop)(size_t)) {
      double best = 0;
      for (int run = 0; run < 5; ++run) {
        const auto t0 = std::chrono::steady_clock::now();
        const double flops = loop(2048);
        best = std::max(best, flops / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      return best;
    };
    return rate(&detail::bf16_dot_loop) > rate(detail::kernels_for(Isa::Avx512).fma_loop) ? Bf16Gemm::Dot
                                                                                           : Bf16Gemm::Fma;
  }();
  return fastest;
}

Exec::Exec(ThreadPool& p, Isa i, Precision pr) : pool(&p), isa(i), precision(pr) {
  if (!isa_supported(i)) fail("kernels: this CPU does not support the {} path", isa_name(i));
}

Bf16Gemm Exec::gemm_kernels() const {
  return precision == Precision::Bf16 && isa == Isa::Avx512 && bf16_dot_supported() ? bf16_gemm : Bf16Gemm::Fma;
}

namespace {
// Attention's products on bf16 pairs where a bf16 route is the faster (Exec::bf16_gemm Dot: the dot,
// Amx and AmxModel: the tiles), else on the f32 panels with rounded copies (docs/gguf.md, "Which
// kernels a bf16 product takes").
bool bf16_pairs(const Exec& ex) {
  return ex.precision == Precision::Bf16 && ex.isa == Isa::Avx512 && bf16_dot_supported() &&
         ex.bf16_gemm != Bf16Gemm::Fma;
}
bool tile_pairs(const Exec& ex) { return bf16_pairs(ex) && wants_tiles(ex, "attention"); }
}  // namespace

void pack_kv(const float* k, const float* v, size_t ld, size_t n, size_t d, PackedKv& kv, const Exec& ex) {
  kv.n = n, kv.d = d, kv.isa = ex.isa, kv.precision = ex.precision;
  kv.pairs = bf16_pairs(ex), kv.tiles = tile_pairs(ex);
  if (kv.pairs) {
    // The tiles read keys in whole 16-pair steps and values in whole 32-column halves.
    const size_t panels = (n + 63) / 64, dp = (d + 1) / 2, pair_rows = kv.tiles ? (dp + 15) / 16 * 16 : dp;
    kv.k_pairs.resize(panels * pair_rows * 64);
    kv.v_pairs.assign(panels * 32 * (kv.tiles ? (d + 31) / 32 * 32 : (d + 15) / 16 * 16), 0);
    detail::pack_keys_bf16(k, ld, n, d, kv.k_pairs.data(), pair_rows, kv.tiles);
    detail::pack_values_bf16(v, ld, n, d, kv.v_pairs.data(), kv.tiles);
    return;
  }
  const detail::IsaKernels& ik = detail::kernels_for(ex.isa);
  const size_t nr = ik.panel;
  kv.k.resize((n + nr - 1) / nr * nr * d);
  kv.v.resize((d + nr - 1) / nr * nr * n);
  ik.pack_kv(k, v, ld, n, d, kv.k.data(), kv.v.data());
  if (ex.precision == Precision::Bf16) {
    round_to_bf16(kv.k.data(), kv.k.data(), kv.k.size(), ex.isa);
    round_to_bf16(kv.v.data(), kv.v.data(), kv.v.size(), ex.isa);
  }
}

void attend(const float* q, size_t ldq, size_t rows, const PackedKv& kv, size_t k0, size_t k1, float scale,
            const float* mask, size_t ldm, float* out, size_t ldo, const Exec& ex) {
  if (kv.isa != ex.isa || kv.precision != ex.precision || kv.pairs != bf16_pairs(ex) || kv.tiles != tile_pairs(ex))
    fail("attend: keys and values packed for {} at another precision, ISA or route than {}", isa_name(kv.isa),
         isa_name(ex.isa));
  if (k0 >= k1 || k1 > kv.n) fail("attend: keys [{}, {}) outside the {} packed", k0, k1, kv.n);
  if (rows == 0) return;
  const bool round = ex.precision == Precision::Bf16;
  const bool model = ex.bf16_gemm == Bf16Gemm::AmxModel;
  detail::AttendArgs a{q, ldq, rows, kv.k.data(), kv.v.data(), kv.k_pairs.data(), kv.v_pairs.data(), kv.n, kv.d,
                       k0, k1, scale, mask, ldm, out, ldo, ex.isa, round, model, nullptr, 0};
  if (kv.tiles) return detail::attend_amx(a);
  if (kv.pairs) return detail::attend_bf16(a);
  // The scores of whole panels in rows kScoresPad floats longer (4096 keys would put the six rows
  // of a register tile 16 KiB apart, all in one L1 set), and under Bf16 the queries rounded (the
  // probabilities are rounded in the kernel, after the softmax).
  constexpr size_t kScoresPad = 16;
  const detail::IsaKernels& ik = detail::kernels_for(ex.isa);
  const size_t nr = ik.panel;
  a.lds = (k1 + nr - 1) / nr * nr - k0 / nr * nr + kScoresPad;
  thread_local std::vector<float> scratch;
  const size_t maxima = rows * detail::kMaxLanes;
  scratch.resize(rows * a.lds + maxima + (round ? rows * kv.d : 0));
  a.scratch = scratch.data();
  if (round) {
    float* qr = scratch.data() + rows * a.lds + maxima;
    for (size_t r = 0; r < rows; ++r) round_to_bf16(q + r * ldq, qr + r * kv.d, kv.d, ex.isa);
    a.q = qr, a.ldq = kv.d;
  }
  ik.attend(a);
}

}  // namespace vlm::kernels
