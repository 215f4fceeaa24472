#include "kernels/ops.h"

#include <cmath>
#include <limits>

namespace vlm::kernels {

void rms_norm(const float* x, const float* w, float* y, size_t rows, size_t dim, float eps) {
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    double ss = 0.0;
    for (size_t i = 0; i < dim; ++i) ss += double(xr[i]) * xr[i];
    const float inv = float(1.0 / std::sqrt(ss / double(dim) + double(eps)));
    for (size_t i = 0; i < dim; ++i) yr[i] = (xr[i] * inv) * (1.f + w[i]);
  }
}

void layer_norm(const float* x, const float* g, const float* b, float* y, size_t rows, size_t dim,
                float eps) {
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    double s = 0.0;
    for (size_t i = 0; i < dim; ++i) s += xr[i];
    const double mean = s / double(dim);
    double v = 0.0;
    for (size_t i = 0; i < dim; ++i) v += (xr[i] - mean) * (xr[i] - mean);
    const float inv = float(1.0 / std::sqrt(v / double(dim) + double(eps)));
    const float m = float(mean);
    for (size_t i = 0; i < dim; ++i) yr[i] = (xr[i] - m) * inv * g[i] + b[i];
  }
}

namespace {
inline float gelu1(float x) {
  constexpr float kC = 0.7978845608028654f;  // sqrt(2/pi)
  return 0.5f * x * (1.f + std::tanh(kC * (x + 0.044715f * x * x * x)));
}
}  // namespace

void gelu_tanh(float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = gelu1(x[i]);
}

void gelu_tanh_mul(float* gate, const float* up, size_t n) {
  for (size_t i = 0; i < n; ++i) gate[i] = gelu1(gate[i]) * up[i];
}

void softmax(float* x, size_t n) {
  if (n == 0) return;
  float mx = x[0];
  for (size_t i = 1; i < n; ++i) mx = std::fmax(mx, x[i]);
  // An all −inf row would give (−inf) − (−inf) = NaN; shift by 0 instead.
  if (mx == -std::numeric_limits<float>::infinity()) mx = 0.f;
  float sum = 0.f;
  for (size_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  for (size_t i = 0; i < n; ++i) x[i] *= inv;
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
