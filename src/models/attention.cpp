#include "models/attention.h"

#include <limits>
#include <vector>

#include "kernels/ops.h"

namespace vlm::models {

namespace {
constexpr float kLowest = std::numeric_limits<float>::lowest();

float dot(const float* a, const float* b, size_t n) {
  float s = 0.f;
  for (size_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}
}  // namespace

void attention_one(const float* q, const float* k, const float* v, size_t n, const AttnShape& s,
                   size_t h, float* out, float* scratch) {
  const size_t d = s.head_dim, kvh = h / (s.n_heads / s.n_kv_heads), row = s.n_kv_heads * d;
  const float* qh = q + h * d;
  for (size_t j = 0; j < n; ++j) scratch[j] = dot(qh, k + j * row + kvh * d, d) * s.scale;
  kernels::softmax(scratch, n);
  float* oh = out + h * d;
  for (size_t i = 0; i < d; ++i) oh[i] = 0.f;
  for (size_t j = 0; j < n; ++j) {
    const float p = scratch[j];
    const float* vj = v + j * row + kvh * d;
    for (size_t i = 0; i < d; ++i) oh[i] += p * vj[i];
  }
}

void attention_prefill(const float* q, const float* k, const float* v, const float* mask, size_t L,
                       const AttnShape& s, float* out, ThreadPool& pool) {
  const size_t d = s.head_dim, nH = s.n_heads, group = s.n_heads / s.n_kv_heads;
  const size_t krow = s.n_kv_heads * d, qrow = nH * d;
  pool.parallel_for(nH * L, [&](size_t b, size_t e) {
    std::vector<float> score(L);
    std::vector<size_t> keys(L);
    for (size_t u = b; u < e; ++u) {
      const size_t h = u / L, qi = u % L, kvh = h / group;
      const float* qh = q + qi * qrow + h * d;
      const float* mrow = mask + qi * L;
      size_t n = 0;
      for (size_t j = 0; j < L; ++j) {
        if (mrow[j] == kLowest) continue;
        keys[n] = j;
        score[n++] = dot(qh, k + j * krow + kvh * d, d) * s.scale + mrow[j];
      }
      float* oh = out + qi * qrow + h * d;
      for (size_t i = 0; i < d; ++i) oh[i] = 0.f;
      kernels::softmax(score.data(), n);
      for (size_t t = 0; t < n; ++t) {
        const float p = score[t];
        const float* vj = v + keys[t] * krow + kvh * d;
        for (size_t i = 0; i < d; ++i) oh[i] += p * vj[i];
      }
    }
  });
}

}  // namespace vlm::models
