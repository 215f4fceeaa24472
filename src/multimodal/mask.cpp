#include "multimodal/mask.h"

#include "core/error.h"

namespace vlm {

MaskMode parse_mask_mode(std::string_view s) {
  if (s == "causal") return MaskMode::Causal;
  if (s == "hf") return MaskMode::Hf;
  if (s == "mlx") return MaskMode::Mlx;
  fail("unknown mask mode '{}' (expected causal, hf or mlx)", s);
}

std::string_view mask_mode_name(MaskMode m) {
  switch (m) {
    case MaskMode::Causal: return "causal";
    case MaskMode::Hf: return "hf";
    case MaskMode::Mlx: return "mlx";
  }
  return "?";
}

PrefillMasks build_masks(MaskMode mode, std::span<const uint8_t> is_image, int valid_len, int Lp,
                         int window) {
  if (valid_len < 0 || valid_len > Lp)
    fail("mask: valid length {} outside [0, {}]", valid_len, Lp);
  if (window <= 0) fail("mask: sliding window must be positive, got {}", window);
  if (mode == MaskMode::Hf && is_image.size() < size_t(valid_len))
    fail("mask: {} image flags for {} valid positions", is_image.size(), valid_len);

  // group[j]: ordinal of the contiguous image run holding j, −1 for text (§9.1).
  std::vector<int> group(size_t(Lp), -1);
  if (mode == MaskMode::Hf) {
    int g = -1;
    for (int j = 0; j < valid_len; ++j) {
      if (!is_image[size_t(j)]) continue;
      if (j == 0 || !is_image[size_t(j) - 1]) ++g;
      group[size_t(j)] = g;
    }
  }

  const size_t n = size_t(Lp) * size_t(Lp);
  PrefillMasks m;
  m.global.assign(n, kMaskBlocked);
  if (mode != MaskMode::Mlx) m.sliding.assign(n, kMaskBlocked);
  for (int q = 0; q < valid_len; ++q) {
    for (int k = 0; k < valid_len; ++k) {
      bool base;
      if (mode == MaskMode::Mlx) {
        base = true;
      } else {
        const bool same = group[size_t(q)] >= 0 && group[size_t(q)] == group[size_t(k)];
        base = k <= q || same;
      }
      if (!base) continue;
      const size_t at = size_t(q) * size_t(Lp) + size_t(k);
      m.global[at] = kMaskAllowed;
      if (mode != MaskMode::Mlx && q - k < window) m.sliding[at] = kMaskAllowed;
    }
  }
  return m;
}

PrefillMasks build_masks(MaskMode mode, std::span<const int32_t> ids, int valid_len, int Lp,
                         int window, int image_token_id) {
  std::vector<uint8_t> img(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) img[i] = ids[i] == image_token_id;
  return build_masks(mode, img, valid_len, Lp, window);
}

}  // namespace vlm
