#include "core/tensor.h"

#include "core/error.h"

namespace vlm {

float TensorView::at(int64_t i) const {
  switch (dtype) {
    case DType::F32: {
      float v;
      std::memcpy(&v, data + 4 * i, 4);
      return v;
    }
    case DType::F16: {
      uint16_t h;
      std::memcpy(&h, data + 2 * i, 2);
      return f16_to_f32(h);
    }
    case DType::BF16: {
      uint16_t h;
      std::memcpy(&h, data + 2 * i, 2);
      return bf16_to_f32(h);
    }
    default: break;
  }
  fail("tensor '{}' is stored {}: element access needs kernels::format_of(...).to_f32", name, dtype_name(dtype));
}

std::vector<float> TensorView::to_f32() const {
  std::vector<float> out(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) out[size_t(i)] = at(i);
  return out;
}

size_t first_non_finite(std::span<const float> v) {
  // Bit test (exponent all ones), so it also holds under -ffast-math.
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t b;
    std::memcpy(&b, &v[i], 4);
    if ((b & 0x7f800000u) == 0x7f800000u) return i;
  }
  return v.size();
}

}  // namespace vlm
