#include "core/huge_pages.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace vlm {
namespace {

// Arrays of 2 MiB and more are fresh mappings: they read as zeros without being written, keep
// their contents when the vector grows, and are 64-byte aligned like the small ones.
TEST(HugePageVector, LargeArraysAreZeroedMappingsThatKeepTheirContents) {
  HugePageVector<float> big(size_t(3) << 20);  // 12 MiB
  ASSERT_EQ(reinterpret_cast<uintptr_t>(big.data()) % 64, 0u);
  for (size_t i = 0; i < big.size(); i += 1000) EXPECT_EQ(big[i], 0.f) << i;
  for (size_t i = 0; i < big.size(); ++i) big[i] = float(i % 977);
  big.resize(big.size() * 2);
  for (size_t i = 0; i < big.size() / 2; i += 997) EXPECT_EQ(big[i], float(i % 977)) << i;
  EXPECT_EQ(big.back(), 0.f);
  HugePageVector<float> small(100);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data()) % 64, 0u);
  small.assign(100, 2.f);
  EXPECT_EQ(small[99], 2.f);
}

}  // namespace
}  // namespace vlm
