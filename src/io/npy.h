// Writes float32 .npy files (little endian, C order) for `vlm dump`, so any
// reference can compare intermediates cell for cell.
#pragma once
#include <cstdint>
#include <filesystem>
#include <vector>

namespace vlm {

void write_npy(const std::filesystem::path& path, const float* data, const std::vector<int64_t>& shape);

}  // namespace vlm
