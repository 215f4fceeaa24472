#include "nn/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"

namespace vlm::nn {

namespace {
constexpr size_t kRowBlock = 256;  // query rows per score block: caps the work rows at 256 × Lk
// Positions per decode task, each reading its keys, then its values, front to back once
// (kernels/ops.h attend_chunk): 64 f32 rows (128 was no faster on Zen 3), and 128 bf16 rows, the
// same bytes (64 bf16 rows ran 6-25 % slower on the Zen 5 VM: docs/performance.md, "a bf16 KV
// cache").
constexpr size_t decode_chunk(DType kv) { return kv == DType::BF16 ? 128 : 64; }

// Query rows of one attend call for a block of R rows over n keys: each call reads the head's whole
// packed keys and values, so more rows per call read them less often (vision-shaped attention: 96
// rows ran 1.29x faster than 24 on Zen 3, though 96 rows of 4096 scores outgrow L2), while every
// thread keeps about 4 calls per block to balance and its scores stay within 4 MiB (a long prompt
// gets fewer rows, not a scratch of rows × n per thread). Between 24 and 96, whole 6-row tiles.
size_t piece_rows(size_t R, size_t heads, size_t threads, size_t n) {
  constexpr size_t kScoreFloats = size_t(1) << 20;
  return std::clamp<size_t>(std::min(R * heads / (4 * threads), kScoreFloats / n) / 6 * 6, 24, 96);
}

// Grows v to at least n elements; never shrinks, so a warm buffer is reused as is.
template <class T>
void ensure(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
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

}  // namespace

// Every KV head packed once (kernels::pack_kv), then (head, piece_rows) pieces of each score
// block spread over the pool, each one kernels::attend call.
void attention(const float* q, size_t Lq, const float* k, const float* v, size_t Lk, const MaskTiles* mask,
               const AttnShape& s, float* out, AttnScratch& sc, const kernels::Exec& ex) {
  ThreadPool& pool = ex.threads();
  const size_t B = std::min(Lq, kRowBlock);
  if (sc.lo.size() < B) sc.lo.resize(B), sc.hi.resize(B);
  const size_t d = s.head_dim, group = s.n_heads / s.n_kv_heads;
  const size_t krow = s.n_kv_heads * d, qrow = s.n_heads * d;
  if (sc.kv.size() < s.n_kv_heads) sc.kv.resize(s.n_kv_heads);
  pool.parallel_for(s.n_kv_heads, [&](size_t g0, size_t g1) {
    for (size_t g = g0; g < g1; ++g) kernels::pack_kv(k + g * d, v + g * d, krow, Lk, d, sc.kv[g], ex);
  }, 1);
  for_each_block(mask, Lq, Lk, qrow, sc, out, [&](size_t r0, size_t R, size_t k0, size_t k1, const float* tile) {
    const size_t n = k1 - k0, piece = piece_rows(R, s.n_heads, size_t(pool.size()), n);
    const size_t pieces = (R + piece - 1) / piece;
    pool.parallel_for(s.n_heads * pieces, [&](size_t j0, size_t j1) {
      for (size_t j = j0; j < j1; ++j) {
        const size_t h = j % s.n_heads, i0 = j / s.n_heads * piece, rows = std::min(piece, R - i0);
        kernels::attend(q + (r0 + i0) * qrow + h * d, qrow, rows, sc.kv[h / group], k0, k1, s.scale,
                        tile ? tile + i0 * n : nullptr, n, out + (r0 + i0) * qrow + h * d, qrow, ex);
      }
    }, 1);
  });
}

// attention_decode's work per task: scores [H, chunk], and m[H], l[H], o[H, d].
void ensure_decode(AttnScratch& sc, const AttnShape& s, size_t tasks, size_t chunk) {
  ensure(sc.scores, tasks * s.n_heads * chunk);
  ensure(sc.part, tasks * s.n_heads * (s.head_dim + 2));
}

void reserve_decode(AttnScratch& sc, const AttnShape& s, size_t rows, size_t max_keys) {
  sc.first.reserve(rows + 1);
  for (DType kv : {DType::F32, DType::BF16}) {  // either cache
    const size_t chunk = decode_chunk(kv), tasks = rows * ((max_keys + chunk - 1) / chunk);
    sc.tasks.reserve(tasks);
    ensure_decode(sc, s, tasks, chunk);
  }
}

void attention_decode(std::span<const DecodeRow> rows, const AttnShape& s, DType kv, AttnScratch& sc,
                      const kernels::Exec& ex) {
  if (kv != DType::F32 && kv != DType::BF16)
    fail("attention_decode: keys and values are F32 or BF16, not {}", dtype_name(kv));
  const size_t d = s.head_dim, H = s.n_heads, chunk = decode_chunk(kv);
  if (rows.empty()) return;
  sc.tasks.clear();  // every row's chunks, in row order
  for (size_t r = 0; r < rows.size(); ++r)
    for (size_t t0 = 0; t0 < rows[r].n; t0 += chunk) sc.tasks.push_back({r, t0});
  const size_t part = H * (d + 2);  // per chunk: m[H], l[H], o[H, d]
  ensure_decode(sc, s, sc.tasks.size(), chunk);
  // Fewer chunks than threads (512 f32 keys are 8 chunks: none for 8 of 16 threads): a chunk's KV
  // heads split into groups until every thread has a piece, as far as the heads divide. A group's
  // reads are then pieces of each position's row rather than the whole row (the 4B at 16 threads:
  // 2 KiB of 4 KiB); each head's sums are the same either way.
  const size_t chunks = sc.tasks.size(), threads = size_t(ex.threads().size());
  size_t splits = 1;
  while (chunks * splits < threads && s.n_kv_heads % (2 * splits) == 0) splits *= 2;
  struct Job {
    const DecodeRow* rows;
    const DecodeTask* tasks;
    const size_t* first;  // the merge's: each row's first chunk
    float *p, *part;
    size_t H, G, d, krow, part_size, splits, kv_heads, chunk;  // kv_heads: per piece
    float scale;
    kernels::Isa isa;
    bool bf16;
  } job{rows.data(), sc.tasks.data(), nullptr, sc.scores.data(), sc.part.data(), H, H / s.n_kv_heads, d,
        s.n_kv_heads * d, part, splits, s.n_kv_heads / splits, chunk, s.scale, ex.isa, kv == DType::BF16};
  // The loop bodies see one small struct, so handing them to the pool allocates nothing.
  ex.threads().parallel_for(chunks * splits, [&job](size_t i0, size_t i1) {
    const Job& j = job;
    for (size_t piece = i0; piece < i1; ++piece) {
      const size_t i = piece / j.splits, g = piece % j.splits * j.kv_heads, h = g * j.G;  // chunk, heads
      const DecodeTask& t = j.tasks[i];
      const DecodeRow& r = j.rows[t.row];
      const size_t n = std::min(r.n - t.t0, j.chunk);
      float* out = j.part + i * j.part_size;
      const size_t at = t.t0 * j.krow + g * j.d;
      auto run = [&](const auto* k, const auto* v) {
        kernels::attend_chunk(r.q + h * j.d, j.kv_heads * j.G, j.G, k + at, v + at, j.krow, n, j.d, j.scale,
                              j.p + (i * j.H + h) * j.chunk, out + h, out + j.H + h, out + 2 * j.H + h * j.d,
                              j.isa);
      };
      if (j.bf16) run(static_cast<const uint16_t*>(r.k), static_cast<const uint16_t*>(r.v));
      else run(static_cast<const float*>(r.k), static_cast<const float*>(r.v));
    }
  }, 1);
  // Each head's softmax over all keys from its chunks: Σ_c e^(m_c − M)·o_c / Σ_c e^(m_c − M)·l_c.
  // The (row, head) merges over the pool in ranges of about kMergeWork multiply-adds: eight rows of
  // 2048 keys are 64 heads × 32 chunks × 256 values a layer, which the calling thread did alone.
  sc.first.assign(1, 0);  // each row's first chunk, then the end
  for (const DecodeRow& r : rows) sc.first.push_back(sc.first.back() + (r.n + chunk - 1) / chunk);
  job.first = sc.first.data();
  constexpr size_t kMergeWork = size_t(1) << 15;
  const size_t per_item = chunks / rows.size() * d;
  ex.threads().parallel_for(rows.size() * H, [&job](size_t i0, size_t i1) {
    const Job& j = job;
    for (size_t item = i0; item < i1; ++item) {
      const size_t row = item / j.H, h = item % j.H, c0 = j.first[row], c1 = j.first[row + 1];
      float* o = j.rows[row].out + h * j.d;
      std::fill(o, o + j.d, 0.f);  // a row with no keys stays zeros
      if (c0 == c1) continue;
      float M = -INFINITY;
      for (size_t c = c0; c < c1; ++c) M = std::max(M, j.part[c * j.part_size + h]);
      float L = 0.f;
      for (size_t c = c0; c < c1; ++c) {
        const float* pc = j.part + c * j.part_size;
        const float w = std::exp(pc[h] - M);  // 1 exactly for the chunk holding the max
        L += w * pc[j.H + h];
        const float* oc = pc + 2 * j.H + h * j.d;
        for (size_t x = 0; x < j.d; ++x) o[x] += w * oc[x];
      }
      const float inv = 1.f / L;
      for (size_t x = 0; x < j.d; ++x) o[x] *= inv;
    }
  }, std::max<size_t>(1, kMergeWork / std::max<size_t>(1, per_item)));
}

}  // namespace vlm::nn
