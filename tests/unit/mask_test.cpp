// The mask builder against the grids of docs/gemma3/masks.md#example, written out by hand from the
// notes, plus the padding and mode rules of issue 6.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "models/mask.h"

namespace vlm {
namespace {

constexpr int32_t kImg = 262144;

// "1" allowed, "." blocked, one string per query row.
std::vector<float> grid(const std::vector<std::string>& rows) {
  std::vector<float> m;
  for (const std::string& r : rows)
    for (char c : r) m.push_back(c == '1' ? kMaskAllowed : kMaskBlocked);
  return m;
}

// docs/gemma3/masks.md#example without its left pad: t0 t1 BOI i0 i1 i2 EOI t2 t3 (indices shift by one; the
// rule only depends on differences and on the image run).
const std::vector<int32_t> kSeq = {10, 11, 255999, kImg, kImg, kImg, 256000, 12, 13};

TEST(Mask, HfGlobalMatchesSpecGrid) {
  PrefillMasks m = build_masks(MaskMode::Hf, kSeq, 9, 9, 1024, kImg);
  EXPECT_EQ(m.global, grid({"1........", "11.......", "111......", "111111...", "111111...",
                            "111111...", "1111111..", "11111111.", "111111111"}));
  EXPECT_EQ(m.sliding, m.global);  // W ≥ 10: the window changes nothing
}

TEST(Mask, HfSlidingWindow3MatchesSpecGrid) {
  PrefillMasks m = build_masks(MaskMode::Hf, kSeq, 9, 9, 3, kImg);
  EXPECT_EQ(m.sliding, grid({"1........", "11.......", "111......", ".11111...", "..1111...",
                             "...111...", "....111..", ".....111.", "......111"}));
}

// docs/gemma3/masks.md#example: t0 BOI a0 a1 EOI BOI b0 b1 EOI t1 — images attend within their own run only.
TEST(Mask, HfTwoImagesDoNotSeeEachOther) {
  const std::vector<int32_t> ids = {10, 255999, kImg, kImg, 256000, 255999, kImg, kImg, 256000, 11};
  PrefillMasks m = build_masks(MaskMode::Hf, ids, 10, 10, 1024, kImg);
  EXPECT_EQ(m.global, grid({"1.........", "11........", "1111......", "1111......", "11111.....",
                            "111111....", "11111111..", "11111111..", "111111111.", "1111111111"}));
}

TEST(Mask, RightPaddingBlocksPadRowsAndColumns) {
  for (MaskMode mode : {MaskMode::Causal, MaskMode::Hf, MaskMode::Mlx}) {
    PrefillMasks m = build_masks(mode, kSeq, 9, 12, 3, kImg);
    for (const std::vector<float>* mk : {&m.global, &m.sliding}) {
      if (mk->empty()) continue;
      ASSERT_EQ(mk->size(), 144u);
      for (int q = 0; q < 12; ++q)
        for (int k = 0; k < 12; ++k)
          if (q >= 9 || k >= 9) EXPECT_EQ((*mk)[size_t(q * 12 + k)], kMaskBlocked) << q << "," << k;
    }
  }
}

TEST(Mask, CausalIgnoresImages) {
  PrefillMasks m = build_masks(MaskMode::Causal, kSeq, 9, 9, 3, kImg);
  std::vector<std::string> g, s;
  for (int q = 0; q < 9; ++q) {
    std::string rg, rs;
    for (int k = 0; k < 9; ++k) {
      rg += k <= q ? '1' : '.';
      rs += k <= q && q - k < 3 ? '1' : '.';
    }
    g.push_back(rg);
    s.push_back(rs);
  }
  EXPECT_EQ(m.global, grid(g));
  EXPECT_EQ(m.sliding, grid(s));
}

TEST(Mask, MlxAllowsEveryValidPairWithOneMask) {
  PrefillMasks m = build_masks(MaskMode::Mlx, kSeq, 7, 9, 3, kImg);
  EXPECT_TRUE(m.sliding.empty());
  for (int q = 0; q < 9; ++q)
    for (int k = 0; k < 9; ++k)
      EXPECT_EQ(m.global[size_t(q * 9 + k)], q < 7 && k < 7 ? kMaskAllowed : kMaskBlocked);
}

TEST(Mask, ModesAndErrors) {
  EXPECT_EQ(parse_mask_mode("hf"), MaskMode::Hf);
  EXPECT_EQ(mask_mode_name(parse_mask_mode("mlx")), "mlx");
  EXPECT_THROW(parse_mask_mode("bidirectional"), Error);
  EXPECT_THROW(build_masks(MaskMode::Causal, kSeq, 10, 9, 3, kImg), Error);
  EXPECT_THROW(build_masks(MaskMode::Causal, kSeq, 9, 9, 0, kImg), Error);
}


// ---- MaskSpec tiles against the rule written out cell by cell ----

// The mask rule for query position q and key position k of a prompt whose first `valid`
// positions are real: causal (k ≤ q) or, in hf mode, the same image run; sliding layers
// also q − k < W, after the OR; mlx every valid pair.
bool rule(MaskMode mode, const std::vector<int32_t>& group, int valid, int W, bool sliding, int q, int k) {
  if (q >= valid || k >= valid) return false;
  if (mode == MaskMode::Mlx) return true;
  const bool same = mode == MaskMode::Hf && group[size_t(q)] >= 0 && group[size_t(q)] == group[size_t(k)];
  return (k <= q || same) && (!sliding || q - k < W);
}

// A prompt of n positions with `images` image runs of random lengths at random places.
std::vector<int32_t> random_groups(std::mt19937& rng, int n, int images) {
  std::vector<int32_t> g(size_t(n), -1);
  int at = 0;
  for (int i = 0; i < images && at < n; ++i) {
    at += int(rng() % 4);                     // text before the run (0 to 3 tokens)
    const int len = 1 + int(rng() % 6);       // 1 to 6 image tokens
    for (int j = at; j < std::min(n, at + len); ++j) g[size_t(j)] = i;
    at += len + 1 + int(rng() % 2);           // at least one text token between runs
  }
  return g;
}

// Every mode, 0–3 images, with and without right padding, windows below and above the
// prompt: the dense form (dumps) and the old dense builder equal the rule cell for cell,
// and random tiles equal the same cells; each row's span holds every allowed key and
// starts and ends on one.
TEST(MaskTiles, FirstChunkEqualsTheRuleInEveryMode) {
  std::mt19937 rng(7);
  for (MaskMode mode : {MaskMode::Causal, MaskMode::Hf, MaskMode::Mlx})
    for (int images = 0; images <= 3; ++images)
      for (int W : {3, 8, 1000})
        for (int pad : {0, 5}) {
          const int valid = 14 + int(rng() % 12), Lp = valid + pad;
          std::vector<int32_t> group = random_groups(rng, valid, images);
          std::vector<uint8_t> is_image(static_cast<size_t>(valid));
          for (int j = 0; j < valid; ++j) is_image[size_t(j)] = group[size_t(j)] >= 0;
          group.resize(size_t(Lp), -1);
          models::MaskSpec spec;
          spec.mode = mode;
          spec.window = W;
          spec.group = group;
          const PrefillMasks built = build_masks(mode, is_image, valid, Lp, W);
          for (bool sliding : {false, true}) {
            const std::vector<float> dense = models::dense_mask(spec, sliding, valid, Lp);
            const std::vector<float>& old = sliding && !built.sliding.empty() ? built.sliding : built.global;
            for (int q = 0; q < Lp; ++q) {
              int64_t lo, hi;
              models::mask_row_span(spec, sliding, 0, valid, q, &lo, &hi);
              for (int k = 0; k < Lp; ++k) {
                const float want = rule(mode, group, valid, W, sliding, q, k) ? kMaskAllowed : kMaskBlocked;
                ASSERT_EQ(dense[size_t(q * Lp + k)], want) << mask_mode_name(mode) << " q " << q << " k " << k;
                ASSERT_EQ(old[size_t(q * Lp + k)], want) << mask_mode_name(mode) << " q " << q << " k " << k;
                if (want == kMaskAllowed) ASSERT_TRUE(k >= lo && k < hi) << q << "," << k;
              }
              if (lo < hi) {
                ASSERT_EQ(dense[size_t(q * Lp + lo)], kMaskAllowed);
                ASSERT_EQ(dense[size_t(q * Lp + hi - 1)], kMaskAllowed);
              }
            }
            for (int t = 0; t < 20; ++t) {
              const int q0 = int(rng() % size_t(Lp)), q1 = q0 + 1 + int(rng() % size_t(Lp - q0));
              const int k0 = int(rng() % size_t(Lp)), k1 = k0 + 1 + int(rng() % size_t(Lp - k0));
              std::vector<float> tile(size_t((q1 - q0) * (k1 - k0)));
              models::mask_tile(spec, sliding, 0, valid, q0, q1, k0, k1, tile.data());
              for (int q = q0; q < q1; ++q)
                for (int k = k0; k < k1; ++k)
                  ASSERT_EQ(tile[size_t((q - q0) * (k1 - k0) + k - k0)], dense[size_t(q * Lp + k)]);
            }
          }
        }
}

// A prompt cut into chunks (never inside an image run), the last one right-padded: the
// tiles of the chunk at position P over keys [0, P + Lp) are exactly the rows P.. of the
// whole prompt's mask, cached keys included, with padding blocked.
TEST(MaskTiles, ChunksAtOffsetsEqualTheWholePromptRows) {
  std::mt19937 rng(11);
  for (MaskMode mode : {MaskMode::Causal, MaskMode::Hf})
    for (int images = 0; images <= 3; ++images)
      for (int W : {3, 8, 1000}) {
        const int n = 30 + int(rng() % 10);
        const std::vector<int32_t> group = random_groups(rng, n, images);
        std::vector<int> cuts = {0};
        for (int at = 1 + int(rng() % 6); at < n; at += 1 + int(rng() % 9))
          if (group[size_t(at)] < 0 || group[size_t(at)] != group[size_t(at - 1)]) cuts.push_back(at);
        cuts.push_back(n);
        ASSERT_GE(cuts.size(), 3u);
        for (size_t c = 0; c + 1 < cuts.size(); ++c) {
          const int P = cuts[c], valid = cuts[c + 1] - P, Lp = valid + (c + 2 == cuts.size() ? 3 : 0);
          models::MaskSpec spec;
          spec.mode = mode;
          spec.window = W;
          spec.group.assign(group.begin() + P, group.begin() + P + valid);
          spec.group.resize(size_t(Lp), -1);
          models::check_mask_spec(spec, P, Lp);
          for (bool sliding : {false, true}) {
            const int K = P + Lp;
            std::vector<float> tile(size_t(Lp * K));
            models::mask_tile(spec, sliding, P, valid, 0, Lp, 0, K, tile.data());
            for (int i = 0; i < Lp; ++i)
              for (int k = 0; k < K; ++k) {
                const bool want = k < P + valid && rule(mode, group, P + valid, W, sliding, P + i, k);
                ASSERT_EQ(tile[size_t(i * K + k)], want ? kMaskAllowed : kMaskBlocked)
                    << mask_mode_name(mode) << " W " << W << " P " << P << " row " << i << " key " << k;
              }
          }
        }
      }
}

// The explicit dense door: the caller's values are used cell for cell (a blocked cell
// inside the allowed span stays blocked; any finite value passes through), cached keys
// follow the continuation rule.
TEST(MaskTiles, DenseDoorUsedCellForCell) {
  PrefillMasks m = build_masks(MaskMode::Hf, kSeq, 9, 9, 3, kImg);
  m.global[size_t(5 * 9 + 1)] = kMaskBlocked;  // the --block-cell test hook
  m.global[size_t(6 * 9 + 2)] = -2.5f;
  models::MaskSpec spec;
  spec.window = 3;
  spec.dense_global = &m.global;
  spec.dense_sliding = &m.sliding;
  EXPECT_EQ(models::dense_mask(spec, false, 9, 9), m.global);
  EXPECT_EQ(models::dense_mask(spec, true, 9, 9), m.sliding);
  const int P = 4, K = P + 9;
  std::vector<float> tile(size_t(9 * K));
  models::mask_tile(spec, true, P, 9, 0, 9, 0, K, tile.data());
  for (int q = 0; q < 9; ++q) {
    for (int k = 0; k < P; ++k)
      EXPECT_EQ(tile[size_t(q * K + k)], P + q - k < 3 ? kMaskAllowed : kMaskBlocked) << q << "," << k;
    for (int j = 0; j < 9; ++j) EXPECT_EQ(tile[size_t(q * K + P + j)], m.sliding[size_t(q * 9 + j)]);
  }
  std::vector<float> bad = m.global;
  bad[3] = NAN;
  spec.dense_global = &bad;
  EXPECT_THROW(models::check_mask_spec(spec, 0, 9), Error);
  spec.dense_global = &m.global;
  EXPECT_THROW(models::check_mask_spec(spec, 0, 8), Error);
}

}  // namespace
}  // namespace vlm
