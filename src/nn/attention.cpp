#include "nn/attention.h"

#include <algorithm>
#include <cstring>

#include "core/dtype.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"

namespace vlm::nn {

namespace {
constexpr size_t kRowBlock = 256;  // query rows per score block: caps the work rows at 256 × Lk
constexpr size_t kBf16Rows = 24;   // query rows of one attend_bf16 call: its scores stay in L2

// Grows v to at least n elements; never shrinks, so a warm buffer is reused as is.
template <class T>
void ensure(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

// A copy of n values rounded to bf16 (nearest even), in buf.
const float* rounded(const float* x, size_t n, std::vector<float>& buf, ThreadPool& pool) {
  ensure(buf, n);
  float* out = buf.data();
  pool.parallel_for(n, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) out[i] = round_bf16(x[i]);
  });
  return out;
}

// The query rows of one score block: the keys [k0, k1) holding every allowed entry of rows
// [r0, r0 + R) (k1 <= k0: none) and, with a mask, their additive tile in sc.tile.
void block_keys(const MaskTiles* mask, size_t r0, size_t R, size_t Lk, AttnScratch& sc, size_t* k0, size_t* k1) {
  *k0 = 0, *k1 = Lk;
  if (!mask) return;
  *k0 = Lk, *k1 = 0;
  for (size_t i = 0; i < R; ++i) {
    mask->row_span(r0 + i, &sc.lo[i], &sc.hi[i]);
    sc.hi[i] = std::min(sc.hi[i], Lk);
    if (sc.lo[i] < sc.hi[i]) *k0 = std::min(*k0, sc.lo[i]), *k1 = std::max(*k1, sc.hi[i]);
  }
  if (*k1 <= *k0) return;
  ensure(sc.tile, R * (*k1 - *k0));
  mask->tile(r0, r0 + R, *k0, *k1, sc.tile.data());
}

// body(r0, R, k0, k1, tile) for each block of kRowBlock query rows [r0, r0 + R) that has an
// allowed key, all of them in keys [k0, k1) (tile: the block's additive values, null without a
// mask); rows with no allowed key are zeros.
template <class Body>
void for_each_block(const MaskTiles* mask, size_t Lq, size_t Lk, size_t qrow, AttnScratch& sc, float* out,
                    Body body) {
  for (size_t r0 = 0; r0 < Lq; r0 += kRowBlock) {
    const size_t R = std::min(Lq, r0 + kRowBlock) - r0;
    size_t k0, k1;
    block_keys(mask, r0, R, Lk, sc, &k0, &k1);
    if (k1 <= k0) {
      std::memset(out + r0 * qrow, 0, R * qrow * sizeof(float));
      continue;
    }
    body(r0, R, k0, k1, mask ? sc.tile.data() : nullptr);
    if (mask)
      for (size_t i = 0; i < R; ++i)
        if (sc.lo[i] >= sc.hi[i]) std::memset(out + (r0 + i) * qrow, 0, qrow * sizeof(float));
  }
}

// Precision::Bf16 on AVX512-BF16: every KV head packed once, then (head, 24-row) pieces of each
// score block spread over the pool, each one attend_bf16 call.
void attention_bf16dot(const float* q, size_t Lq, const float* k, const float* v, size_t Lk, const MaskTiles* mask,
                       const AttnShape& s, float* out, AttnScratch& sc, ThreadPool& pool) {
  const size_t d = s.head_dim, group = s.n_heads / s.n_kv_heads;
  const size_t krow = s.n_kv_heads * d, qrow = s.n_heads * d;
  if (sc.kv.size() < s.n_kv_heads) sc.kv.resize(s.n_kv_heads);
  pool.parallel_for(s.n_kv_heads, [&](size_t g0, size_t g1) {
    for (size_t g = g0; g < g1; ++g) kernels::pack_kv_bf16(k + g * d, v + g * d, krow, Lk, d, sc.kv[g]);
  }, 1);
  for_each_block(mask, Lq, Lk, qrow, sc, out, [&](size_t r0, size_t R, size_t k0, size_t k1, const float* tile) {
    const size_t pieces = (R + kBf16Rows - 1) / kBf16Rows, n = k1 - k0;
    pool.parallel_for(s.n_heads * pieces, [&](size_t j0, size_t j1) {
      for (size_t j = j0; j < j1; ++j) {
        const size_t h = j % s.n_heads, i0 = j / s.n_heads * kBf16Rows, rows = std::min(kBf16Rows, R - i0);
        kernels::attend_bf16(q + (r0 + i0) * qrow + h * d, qrow, rows, sc.kv[h / group], k0, k1, s.scale,
                             tile ? tile + i0 * n : nullptr, n, out + (r0 + i0) * qrow + h * d, qrow);
      }
    }, 1);
  });
}

}  // namespace

void attention(const float* q, size_t Lq, const float* k, const float* v, size_t Lk, const MaskTiles* mask,
               const AttnShape& s, float* out, AttnScratch& sc, const kernels::Exec& ex) {
  ThreadPool& pool = ex.threads();
  const size_t B = std::min(Lq, kRowBlock);
  if (sc.lo.size() < B) sc.lo.resize(B), sc.hi.resize(B);
  const bool bf16 = ex.precision == kernels::Precision::Bf16;
  if (bf16 && ex.isa == kernels::Isa::Avx512 && kernels::bf16_dot_supported())
    return attention_bf16dot(q, Lq, k, v, Lk, mask, s, out, sc, pool);
  using kernels::Layout;
  const size_t d = s.head_dim, group = s.n_heads / s.n_kv_heads;
  const size_t krow = s.n_kv_heads * d, qrow = s.n_heads * d;
  if (bf16) {  // the products round q and P (their x); keys and values are rounded here
    k = rounded(k, Lk * krow, sc.k_bf16, pool);
    v = rounded(v, Lk * krow, sc.v_bf16, pool);
  }
  for_each_block(mask, Lq, Lk, qrow, sc, out, [&](size_t r0, size_t R, size_t k0, size_t k1, const float* tile) {
    const size_t n = k1 - k0;
    ensure(sc.scores, R * n);
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
  });
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
