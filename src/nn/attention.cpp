#include "nn/attention.h"

#include <algorithm>
#include <cstring>

#include "kernels/matmul.h"
#include "kernels/ops.h"

namespace vlm::nn {

namespace {
constexpr size_t kRowBlock = 256;  // query rows per score block: caps the work rows at 256 × Lk

// Grows v to at least n elements; never shrinks, so a warm buffer is reused as is.
void ensure(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}
}  // namespace

void attention(const float* q, size_t Lq, const float* k, const float* v, size_t Lk, const MaskTiles* mask,
               const AttnShape& s, float* out, AttnScratch& sc, const kernels::Exec& exec) {
  const kernels::Exec ex = exec.exact();  // activations times activations: f32 (kernels/exec.h)
  ThreadPool& pool = ex.threads();
  using kernels::Layout;
  const size_t d = s.head_dim, group = s.n_heads / s.n_kv_heads;
  const size_t krow = s.n_kv_heads * d, qrow = s.n_heads * d;
  const size_t B = std::min(Lq, kRowBlock);
  if (sc.lo.size() < B) sc.lo.resize(B), sc.hi.resize(B);
  for (size_t r0 = 0; r0 < Lq; r0 += kRowBlock) {
    const size_t R = std::min(Lq, r0 + kRowBlock) - r0;
    // Keys [k0, k1) hold every allowed entry of these rows.
    size_t k0 = 0, k1 = Lk;
    if (mask) {
      k0 = Lk, k1 = 0;
      for (size_t i = 0; i < R; ++i) {
        mask->row_span(r0 + i, &sc.lo[i], &sc.hi[i]);
        sc.hi[i] = std::min(sc.hi[i], Lk);
        if (sc.lo[i] < sc.hi[i]) k0 = std::min(k0, sc.lo[i]), k1 = std::max(k1, sc.hi[i]);
      }
    }
    if (k1 <= k0) {
      std::memset(out + r0 * qrow, 0, R * qrow * sizeof(float));
      continue;
    }
    const size_t n = k1 - k0;
    ensure(sc.scores, R * n);
    if (mask) {
      ensure(sc.tile, R * n);
      mask->tile(r0, r0 + R, k0, k1, sc.tile.data());
    }
    const float* tile = mask ? sc.tile.data() : nullptr;
    float* scores = sc.scores.data();
    for (size_t h = 0; h < s.n_heads; ++h) {
      const size_t g = h / group;
      const kernels::Weight K = kernels::f32_weight(k + k0 * krow + g * d, n, d, krow);
      const kernels::Weight V = kernels::f32_weight(v + k0 * krow + g * d, n, d, krow);
      kernels::matmul_strided(q + r0 * qrow + h * d, qrow, R, K, Layout::NK, nullptr, scores, n, ex);
      pool.parallel_for(R, [&](size_t i0, size_t i1) {
        for (size_t i = i0; i < i1; ++i) {
          float* row = scores + i * n;
          if (tile) {
            const float* m = tile + i * n;
            for (size_t j = 0; j < n; ++j) row[j] = row[j] * s.scale + m[j];
          } else if (s.scale != 1.f) {
            for (size_t j = 0; j < n; ++j) row[j] *= s.scale;
          }
          kernels::softmax(row, n, ex.isa);
        }
      });
      kernels::matmul_strided(scores, n, R, V, Layout::KN, nullptr, out + r0 * qrow + h * d, qrow, ex);
    }
    if (mask)
      for (size_t i = 0; i < R; ++i)
        if (sc.lo[i] >= sc.hi[i]) std::memset(out + (r0 + i) * qrow, 0, qrow * sizeof(float));
  }
}

void attention_decode(const float* q, const float* k, const float* v, size_t n, const AttnShape& s, float* out,
                      AttnScratch& sc, const kernels::Exec& exec) {
  const kernels::Exec ex = exec.exact();  // activations times activations: f32 (kernels/exec.h)
  ThreadPool& pool = ex.threads();
  using kernels::Layout;
  const size_t d = s.head_dim, group = s.n_heads / s.n_kv_heads, krow = s.n_kv_heads * d;
  ensure(sc.scores, s.n_heads * n);
  float* scores = sc.scores.data();
  // The `group` query heads sharing KV head g are adjacent rows of q and of out.
  for (size_t g = 0; g < s.n_kv_heads; ++g) {
    const kernels::Weight K = kernels::f32_weight(k + g * d, n, d, krow);
    float* p = scores + g * group * n;
    kernels::matmul_strided(q + g * group * d, d, group, K, Layout::NK, nullptr, p, n, ex);
    for (size_t i = 0; i < group; ++i) {
      float* row = p + i * n;
      for (size_t j = 0; j < n; ++j) row[j] *= s.scale;
      kernels::softmax(row, n, ex.isa);
    }
  }
  // o = P·v for every head, columns of each head split over the pool. The loop body sees
  // one small struct, so handing it to the pool allocates nothing.
  struct Pv {
    const float *p, *v;
    float* out;
    size_t n, d, group, heads, krow;
  } job{scores, v, out, n, d, group, s.n_heads, krow};
  pool.parallel_for(s.n_heads * d, [&job](size_t c0, size_t c1) {
    const Pv& j = job;
    for (size_t c = c0; c < c1;) {  // one head's column range at a time
      const size_t h = c / j.d, c_end = std::min(c1, (h + 1) * j.d), off = c - h * j.d;
      const float* p = j.p + h * j.n;
      const float* vh = j.v + (h / j.group) * j.d + off;
      float* o = j.out + c;
      const size_t w = c_end - c;
      std::fill(o, o + w, 0.f);
      for (size_t t = 0; t < j.n; ++t) {
        const float pt = p[t];
        const float* vt = vh + t * j.krow;
        for (size_t x = 0; x < w; ++x) o[x] += pt * vt[x];
      }
      c = c_end;
    }
  });
}

}  // namespace vlm::nn
