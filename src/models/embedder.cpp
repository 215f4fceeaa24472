#include "models/embedder.h"

#include <cmath>

#include "core/error.h"
#include "kernels/format.h"

namespace vlm {

TextEmbedder::TextEmbedder(const TensorView& table, EmbedScaling scaling)
    : table_(&table), scaling_(scaling) {
  if (table.shape.size() != 2) fail("{}: expected a 2-D embedding table", table.name);
  vocab_ = size_t(table.dim(0));
  hidden_ = size_t(table.dim(1));
  const float s = std::sqrt(float(hidden_));  // HF keeps √H as an f32 buffer
  scale_ = s;
  if (scaling == EmbedScaling::Reference) {
    if (table.dtype == DType::BF16) scale_ = round_bf16(s);
    if (table.dtype == DType::F16) scale_ = f16_to_f32(f32_to_f16(s));
  }
}

void TextEmbedder::embed(std::span<const int32_t> ids, float* rows) const {
  const TensorView& t = *table_;
  for (size_t r = 0; r < ids.size(); ++r) {
    const int32_t id = ids[r];
    if (id < 0 || size_t(id) >= vocab_)
      fail("token id {} is outside the vocabulary of {} ({})", id, vocab_, t.name);
    float* out = rows + r * hidden_;
    const size_t base = size_t(id) * hidden_;
    const bool ref = scaling_ == EmbedScaling::Reference;
    // Products of two bf16 (or two f16) values are exact in f32, so one rounding
    // to the weight dtype reproduces torch's low-precision multiply.
    switch (t.dtype) {
      case DType::F32: {
        const float* w = reinterpret_cast<const float*>(t.data) + base;
        for (size_t i = 0; i < hidden_; ++i) out[i] = w[i] * scale_;
        break;
      }
      case DType::BF16: {
        const uint16_t* w = reinterpret_cast<const uint16_t*>(t.data) + base;
        for (size_t i = 0; i < hidden_; ++i) {
          const float p = bf16_to_f32(w[i]) * scale_;
          out[i] = ref ? round_bf16(p) : p;
        }
        break;
      }
      case DType::F16: {
        const uint16_t* w = reinterpret_cast<const uint16_t*>(t.data) + base;
        for (size_t i = 0; i < hidden_; ++i) {
          const float p = f16_to_f32(w[i]) * scale_;
          out[i] = ref ? f16_to_f32(f32_to_f16(p)) : p;
        }
        break;
      }
      default: {  // block-quantized (GGUF): the row's dequantized values, scaled in f32
        const kernels::Format& f = kernels::format_of(t.dtype);
        f.to_f32(t.data + size_t(id) * f.row_bytes(hidden_), out, hidden_);
        for (size_t i = 0; i < hidden_; ++i) out[i] *= scale_;
        break;
      }
    }
  }
}

std::vector<float> TextEmbedder::embed(std::span<const int32_t> ids) const {
  std::vector<float> rows(ids.size() * hidden_);
  embed(ids, rows.data());
  return rows;
}

}  // namespace vlm
