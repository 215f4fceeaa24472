#include <gtest/gtest.h>

#include <cmath>

#include "core/dtype.h"

namespace vlm {
namespace {

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(round_bf16(50.596443f), 50.5f);   // docs/gemma3/merge-and-scaling.md#constants: bf16(sqrt(2560))
  EXPECT_EQ(round_bf16(61.967735f), 62.0f);   // sqrt(3840)
  EXPECT_EQ(round_bf16(73.321213f), 73.5f);   // sqrt(5376)
  EXPECT_EQ(round_bf16(25.298222f), 25.25f);  // sqrt(640)
  EXPECT_EQ(round_bf16(0.0039216280f), 0.003936767578125f);  // docs/gemma3/preprocessing.md#dtype
  // ties go to even: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7
  EXPECT_EQ(round_bf16(1.0f + 1.0f / 256), 1.0f);
  EXPECT_EQ(round_bf16(1.0f + 3.0f / 256), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(round_bf16(NAN)));
}

TEST(DType, F16RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 65536; ++h) {
    if (((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff)) continue;  // NaN payloads
    EXPECT_EQ(f32_to_f16(f16_to_f32(uint16_t(h))), h) << h;
  }
}

TEST(DType, F16RoundsAndSaturates) {
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f + 1.0f / 2048)), 1.0f);  // tie to even
  EXPECT_EQ(f32_to_f16(65520.f), 0x7c00);                       // overflow to inf
  EXPECT_EQ(f32_to_f16(65519.f), 0x7bff);
  EXPECT_EQ(f16_to_f32(f32_to_f16(3e-8f)), 5.9604644775390625e-8f);  // nearest subnormal
}

}  // namespace
}  // namespace vlm
