// A non-owning view of a stored tensor: bytes live in an mmapped file.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace vlm {

struct TensorView {
  std::string name;  // canonical name (naming-scheme prefix stripped)
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // PyTorch order, outermost first
  const std::byte* data = nullptr;
  size_t nbytes = 0;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int64_t dim(size_t i) const { return shape.at(i); }
  // Element i converted to f32 (slow path: tests, oracles, small tensors).
  float at(int64_t i) const;
  // The whole tensor as f32 (for small tensors such as norm weights).
  std::vector<float> to_f32() const;
};

// Index of the first NaN or ±Inf in v, or v.size() when every value is finite. The
// run-time guard against silent garbage: a decoder or engine calls it on its outputs.
size_t first_non_finite(std::span<const float> v);

}  // namespace vlm
