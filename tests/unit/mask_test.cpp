// The mask builder against the spec's grids (§9.3, §9.5), written out by hand from the
// spec text, plus the padding and mode rules of issue 6.
#include <gtest/gtest.h>

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

// §9.3 without its left pad: t0 t1 BOI i0 i1 i2 EOI t2 t3 (indices shift by one; the
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

// §9.5: t0 BOI a0 a1 EOI BOI b0 b1 EOI t1 — images attend within their own run only.
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

}  // namespace
}  // namespace vlm
