#include "kernels/matmul.h"

#include <cpuid.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "kernels/matmul_impl.h"
#include "kernels/simd_scalar.h"

namespace vlm::kernels {

Weight as_weight(const TensorView& t) {
  if (t.shape.size() != 2) fail("tensor {} is not 2-D", t.name);
  return Weight{t.data, t.dtype, size_t(t.shape[0]), size_t(t.shape[1])};
}

Weight f32_weight(const float* data, size_t rows, size_t cols, size_t ld) {
  return Weight{reinterpret_cast<const std::byte*>(data), DType::F32, rows, cols, ld};
}

namespace {
float load(const std::byte* p, DType t, size_t i) {
  uint16_t h;
  switch (t) {
    case DType::F32: {
      float v;
      std::memcpy(&v, p + 4 * i, 4);
      return v;
    }
    case DType::F16: std::memcpy(&h, p + 2 * i, 2); return f16_to_f32(h);
    case DType::BF16: std::memcpy(&h, p + 2 * i, 2); return bf16_to_f32(h);
  }
  return 0.f;
}
}  // namespace

void matmul_ref(const float* x, size_t M, const Weight& w, float* y, Precision precision) {
  const bool bf16 = precision == Precision::Bf16;
  const size_t K = w.cols, N = w.rows, es = dtype_size(w.dtype);
  for (size_t n = 0; n < N; ++n) {
    const std::byte* row = w.data + n * w.stride() * es;
    for (size_t m = 0; m < M; ++m) {
      const float* xm = x + m * K;
      float acc = 0.f;
      for (size_t k = 0; k < K; ++k) acc += (bf16 ? round_bf16(xm[k]) : xm[k]) * load(row, w.dtype, k);
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

// Up to this many rows, dot products that stream each weight row once beat packing.
constexpr size_t kDotMaxM = 32;

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

// x rounded to bf16 (nearest even), dense [M, K], in a per-thread buffer.
const float* rounded_x(const GemmArgs& a) {
  thread_local std::vector<float> buf;
  buf.resize(a.M * a.K);
  for (size_t m = 0; m < a.M; ++m)
    for (size_t k = 0; k < a.K; ++k) buf[m * a.K + k] = round_bf16(a.x[m * a.ldx + k]);
  return buf.data();
}

void run(GemmArgs a, const Exec& ex) {
  ThreadPool& pool = ex.threads();
  if (a.M == 0 || a.N == 0) return;
  if (a.K == 0) {
    for (size_t m = 0; m < a.M; ++m)
      for (size_t n = 0; n < a.N; ++n) a.y[m * a.ldy + n] = a.bias ? a.bias[n] : 0.f;
    return;
  }
  const IsaKernels& k = detail::kernels_for(ex.isa);
  const bool bf16 = ex.precision == Precision::Bf16;
  // The AVX512-BF16 GEMM rounds x itself; every other path gets x rounded here and then
  // computes the same exact products in f32.
  const bool native = bf16 && a.M > kDotMaxM && a.dtype == DType::BF16 && !a.kn && k.gemm_bf16dot &&
                      bf16_dot_supported();
  if (bf16 && !native) {
    a.x = rounded_x(a);
    a.ldx = a.K;
  }
  if (a.M <= kDotMaxM && !a.kn) {
    pool.parallel_for(a.N, [&](size_t n0, size_t n1) { k.dot(a, n0, n1); });
    return;
  }
  auto* gemm = native ? k.gemm_bf16dot : k.gemm;
  const size_t threads = size_t(pool.size());
  const size_t panels = (a.N + k.panel - 1) / k.panel;
  const size_t tiles = (a.M + k.row_tile - 1) / k.row_tile;
  // Split columns when there are enough panels to balance; otherwise split rows (each
  // thread then packs the whole weight itself).
  if (panels >= 4 * threads || tiles < 2 * threads) {
    pool.parallel_for(panels, [&](size_t p0, size_t p1) {
      const size_t n1 = p1 * k.panel < a.N ? p1 * k.panel : a.N;
      gemm(a, p0 * k.panel, n1, 0, a.M, pack_buffer(k.pack_floats));
    });
  } else {
    pool.parallel_for(tiles, [&](size_t t0, size_t t1) {
      const size_t m1 = t1 * k.row_tile < a.M ? t1 * k.row_tile : a.M;
      gemm(a, 0, a.N, t0 * k.row_tile, m1, pack_buffer(k.pack_floats));
    });
  }
}

}  // namespace

void matmul_strided(const float* x, size_t ldx, size_t M, const Weight& w, Layout layout,
                    const float* bias, float* y, size_t ldy, const Exec& ex) {
  const bool kn = layout == Layout::KN;
  const size_t K = kn ? w.rows : w.cols, N = kn ? w.cols : w.rows;
  if (w.stride() < w.cols || (M > 1 && ldx < K) || (M > 1 && ldy < N))
    fail("matmul: row stride below row length (w {} < {}, x {} < {} or y {} < {})", w.stride(),
         w.cols, ldx, K, ldy, N);
  run(GemmArgs{x, ldx, M, w.data, w.dtype, w.stride(), kn, K, N, bias, y, ldy}, ex);
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

Exec::Exec(ThreadPool& p, Isa i, Precision pr) : pool(&p), isa(i), precision(pr) {
  if (!isa_supported(i)) fail("kernels: this CPU does not support the {} path", isa_name(i));
}

}  // namespace vlm::kernels
