#include "kernels/ops.h"

#include <cmath>

#include "kernels/ops_impl.h"
#include "kernels/simd_scalar.h"

namespace vlm::kernels {

namespace detail {
const OpsKernels kScalarOps = make_ops<S1>();
}  // namespace detail

namespace {
const detail::OpsKernels& ops(Isa isa) {
  switch (isa) {
    case Isa::Avx512: return detail::kAvx512Ops;
    case Isa::Avx2: return detail::kAvx2Ops;
    case Isa::Scalar: break;
  }
  return detail::kScalarOps;
}
}  // namespace

void rms_norm(const float* x, const float* w, float* y, size_t rows, size_t dim, float eps, Isa isa) {
  ops(isa).rms_norm(x, w, y, rows, dim, eps);
}

void layer_norm(const float* x, const float* g, const float* b, float* y, size_t rows, size_t dim,
                float eps, Isa isa) {
  ops(isa).layer_norm(x, g, b, y, rows, dim, eps);
}

void gelu_tanh(float* x, size_t n, Isa isa) { ops(isa).gelu_tanh(x, n); }

void gelu_tanh_mul(float* gate, const float* up, size_t n, Isa isa) {
  ops(isa).gelu_tanh_mul(gate, up, n);
}

void softmax(float* x, size_t n, Isa isa) { ops(isa).softmax(x, n); }

void scaled_softmax(float* x, size_t n, float scale, const float* mask, bool round, Isa isa) {
  ops(isa).scaled_softmax(x, n, scale, mask, round);
}

float scaled_exp(float* x, size_t n, float scale, const float* mask, Isa isa) {
  return ops(isa).scaled_exp(x, n, scale, mask);
}

void exp_normalize(float* x, size_t n, float mx, bool round, Isa isa) { ops(isa).exp_normalize(x, n, mx, round); }

void round_to_bf16(const float* x, float* y, size_t n, Isa isa) { ops(isa).round_to_bf16(x, y, n); }

void to_bf16(const float* x, uint16_t* y, size_t n, Isa isa) { ops(isa).to_bf16(x, y, n); }

void attend_chunk(const float* q, size_t H, size_t G, const float* k, const float* v, size_t stride, size_t n,
                  size_t d, float scale, float* p, float* m, float* l, float* o, Isa isa) {
  ops(isa).attend_chunk(q, H, G, k, v, stride, n, d, scale, p, m, l, o);
}
void attend_chunk(const float* q, size_t H, size_t G, const uint16_t* k, const uint16_t* v, size_t stride,
                  size_t n, size_t d, float scale, float* p, float* m, float* l, float* o, Isa isa) {
  ops(isa).attend_chunk_bf16(q, H, G, k, v, stride, n, d, scale, p, m, l, o);
}

void rope_rotate_half(float* x, size_t heads, size_t d, const float* cos, const float* sin) {
  const size_t half = d / 2;
  for (size_t h = 0; h < heads; ++h) {
    float* xh = x + h * d;
    for (size_t i = 0; i < half; ++i) {
      const float a = xh[i], b = xh[i + half];
      xh[i] = a * cos[i] - b * sin[i];
      xh[i + half] = b * cos[i] + a * sin[i];
    }
  }
}

void rope_inv_freq(size_t d, float base, float factor, float* inv_freq) {
  for (size_t i = 0; i < d / 2; ++i) {
    const float expo = float(2 * i) / float(d);
    inv_freq[i] = (1.f / std::pow(base, expo)) / factor;
  }
}

void rope_cos_sin(int64_t pos, const float* inv_freq, size_t half, float* cos, float* sin) {
  for (size_t i = 0; i < half; ++i) {
    const float t = float(pos) * inv_freq[i];
    cos[i] = std::cos(t);
    sin[i] = std::sin(t);
  }
}

}  // namespace vlm::kernels
