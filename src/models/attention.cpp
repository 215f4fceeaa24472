#include "models/attention.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/matmul.h"
#include "kernels/ops.h"

namespace vlm::models {

namespace {
constexpr float kLowest = std::numeric_limits<float>::lowest();
constexpr size_t kRowBlock = 256;  // query rows per score block: caps scratch at 256 × L
}  // namespace

void attention_prefill(const float* q, size_t Lq, const float* k, const float* v, size_t Lk,
                       const float* mask, const AttnShape& s, float* out, ThreadPool& pool) {
  using kernels::Layout;
  const size_t d = s.head_dim, group = s.n_heads / s.n_kv_heads;
  const size_t krow = s.n_kv_heads * d, qrow = s.n_heads * d;
  std::vector<float> sc(std::min(Lq, kRowBlock) * Lk);
  std::vector<uint8_t> empty(std::min(Lq, kRowBlock));
  for (size_t r0 = 0; r0 < Lq; r0 += kRowBlock) {
    const size_t R = std::min(Lq, r0 + kRowBlock) - r0;
    // Keys [k0, k1) hold every allowed entry of these rows.
    size_t k0 = Lk, k1 = 0;
    for (size_t i = 0; i < R; ++i) {
      const float* m = mask + (r0 + i) * Lk;
      size_t a = 0, b = Lk;
      while (a < Lk && m[a] == kLowest) ++a;
      while (b > a && m[b - 1] == kLowest) --b;
      empty[i] = a == Lk;
      if (a < b) k0 = std::min(k0, a), k1 = std::max(k1, b);
    }
    if (k1 <= k0) {
      std::memset(out + r0 * qrow, 0, R * qrow * sizeof(float));
      continue;
    }
    const size_t n = k1 - k0;
    for (size_t h = 0; h < s.n_heads; ++h) {
      const size_t g = h / group;
      const kernels::Weight K = kernels::f32_weight(k + k0 * krow + g * d, n, d, krow);
      const kernels::Weight V = kernels::f32_weight(v + k0 * krow + g * d, n, d, krow);
      kernels::matmul_strided(q + r0 * qrow + h * d, qrow, R, K, Layout::NK, nullptr, sc.data(), n, pool);
      pool.parallel_for(R, [&](size_t i0, size_t i1) {
        for (size_t i = i0; i < i1; ++i) {
          float* row = sc.data() + i * n;
          const float* m = mask + (r0 + i) * Lk + k0;
          for (size_t j = 0; j < n; ++j) row[j] = row[j] * s.scale + m[j];
          kernels::softmax(row, n);
        }
      });
      kernels::matmul_strided(sc.data(), n, R, V, Layout::KN, nullptr, out + r0 * qrow + h * d, qrow, pool);
    }
    for (size_t i = 0; i < R; ++i)
      if (empty[i]) std::memset(out + (r0 + i) * qrow, 0, qrow * sizeof(float));
  }
}

void attention_decode(const float* q, const float* k, const float* v, size_t n, const AttnShape& s,
                      float* out, ThreadPool& pool) {
  using kernels::Layout;
  const size_t d = s.head_dim, group = s.n_heads / s.n_kv_heads, krow = s.n_kv_heads * d;
  std::vector<float> sc(group * n);
  // The `group` query heads sharing KV head g are adjacent rows of q and of out.
  for (size_t g = 0; g < s.n_kv_heads; ++g) {
    const kernels::Weight K = kernels::f32_weight(k + g * d, n, d, krow);
    const kernels::Weight V = kernels::f32_weight(v + g * d, n, d, krow);
    kernels::matmul_strided(q + g * group * d, d, group, K, Layout::NK, nullptr, sc.data(), n, pool);
    for (size_t i = 0; i < group; ++i) {
      float* row = sc.data() + i * n;
      for (size_t j = 0; j < n; ++j) row[j] *= s.scale;
      kernels::softmax(row, n);
    }
    kernels::matmul_strided(sc.data(), n, group, V, Layout::KN, nullptr, out + g * group * d, d, pool);
  }
}

}  // namespace vlm::models
