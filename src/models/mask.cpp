#include "models/mask.h"

#include <algorithm>
#include <cmath>

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

std::vector<int32_t> image_groups(std::span<const uint8_t> is_image) {
  std::vector<int32_t> group(is_image.size(), -1);
  int32_t g = -1;
  for (size_t j = 0; j < is_image.size(); ++j) {
    if (!is_image[j]) continue;
    if (j == 0 || !is_image[j - 1]) ++g;
    group[j] = g;
  }
  return group;
}

std::vector<int32_t> image_groups(std::span<const int32_t> ids, int32_t image_token_id) {
  std::vector<uint8_t> img(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) img[i] = ids[i] == image_token_id;
  return image_groups(img);
}

namespace models {

namespace {

int32_t group_of(const MaskSpec& s, int64_t j) {
  return s.mode == MaskMode::Hf && size_t(j) < s.group.size() ? s.group[size_t(j)] : -1;
}

const std::vector<float>* dense_of(const MaskSpec& s, bool sliding) {
  return sliding && s.dense_sliding ? s.dense_sliding : s.dense_global;
}

int64_t dense_side(const std::vector<float>& d) { return int64_t(std::llround(std::sqrt(double(d.size())))); }

}  // namespace

// Every row's allowed keys form one run [lo, hi): the cached keys in reach end at P where
// the chunk's own run starts (a window that reaches back into the cache starts the new
// keys at 0), and an image run always contains q, so extending [.., q] by it stays one run.
void mask_row_span(const MaskSpec& spec, bool sliding_layer, int64_t P, int valid_len, int64_t q, int64_t* lo,
                   int64_t* hi) {
  *lo = *hi = 0;
  if (q >= valid_len) return;
  const bool windowed = sliding_layer && spec.mode != MaskMode::Mlx;
  const int64_t c0 = windowed ? std::max<int64_t>(0, P + q - spec.window + 1) : 0;  // first cached key in reach
  int64_t a = 0, b = q + 1;  // new keys [a, b), chunk-local
  if (const std::vector<float>* d = dense_of(spec, sliding_layer)) {
    // Dense door: the caller's first and last allowed new key.
    const float* row = d->data() + q * dense_side(*d);
    a = 0, b = valid_len;
    while (a < b && row[a] == kMaskBlocked) ++a;
    while (b > a && row[b - 1] == kMaskBlocked) --b;
    if (a == b) a = b = 0;
  } else if (spec.mode == MaskMode::Mlx) {
    b = valid_len;
  } else {
    if (const int32_t g = group_of(spec, q); g >= 0)
      while (b < valid_len && group_of(spec, b) == g) ++b;
    if (windowed) a = std::max<int64_t>(0, q - spec.window + 1);
  }
  if (c0 < P) {
    *lo = c0;
    *hi = a < b ? P + b : P;
  } else if (a < b) {
    *lo = P + a;
    *hi = P + b;
  }
}

void mask_tile(const MaskSpec& spec, bool sliding_layer, int64_t P, int valid_len, int64_t q0, int64_t q1,
               int64_t k0, int64_t k1, float* out) {
  const int64_t w = k1 - k0;
  const std::vector<float>* d = dense_of(spec, sliding_layer);
  for (int64_t q = q0; q < q1; ++q) {
    float* row = out + (q - q0) * w;
    int64_t lo, hi;
    mask_row_span(spec, sliding_layer, P, valid_len, q, &lo, &hi);
    lo = std::clamp(lo, k0, k1);
    hi = std::clamp(hi, lo, k1);
    std::fill(row, row + (lo - k0), kMaskBlocked);
    std::fill(row + (lo - k0), row + (hi - k0), kMaskAllowed);
    std::fill(row + (hi - k0), row + w, kMaskBlocked);
    // Dense door: the caller's own values on the new keys (cached keys follow the rule).
    if (d) {
      const float* src = d->data() + q * dense_side(*d) - P;
      for (int64_t k = std::max(lo, P); k < hi; ++k) row[k - k0] = src[k];
    }
  }
}

std::vector<float> dense_mask(const MaskSpec& spec, bool sliding_layer, int valid_len, int Lp) {
  check_mask_spec(spec, 0, Lp);
  if (valid_len < 0 || valid_len > Lp) fail("mask: valid length {} outside [0, {}]", valid_len, Lp);
  std::vector<float> m(size_t(Lp) * size_t(Lp));
  mask_tile(spec, sliding_layer, 0, valid_len, 0, Lp, 0, Lp, m.data());
  return m;
}

void check_mask_spec(const MaskSpec& spec, int64_t P, int rows) {
  if (spec.window <= 0) fail("mask: sliding window must be positive, got {}", spec.window);
  for (const std::vector<float>* d : {spec.dense_global, spec.dense_sliding}) {
    if (!d) continue;
    const char* what = d == spec.dense_global ? "global mask" : "sliding mask";
    if (d->size() != size_t(rows) * size_t(rows))
      fail("prefill: {} has {} entries, expected {}x{}", what, d->size(), rows, rows);
    for (float v : *d)
      if (std::isnan(v) || v == INFINITY) fail("prefill: {} holds NaN or +inf", what);
  }
  if (spec.dense_sliding && !spec.dense_global) fail("prefill: a sliding mask without a global one");
  if (spec.dense_global) return;
  if (spec.mode == MaskMode::Mlx && P > 0)
    fail("mask mode mlx lets every prompt position see every other: the prompt must be prefilled in one "
         "chunk, not continued at position {}", P);
  if (spec.mode == MaskMode::Hf && !spec.group.empty() && spec.group.size() != size_t(rows))
    fail("mask: {} image-group ids for {} rows", spec.group.size(), rows);
}

void SpecTiles::row_span(size_t q, size_t* lo, size_t* hi) const {
  int64_t a, b;
  mask_row_span(s_, sliding_, P_, valid_, int64_t(q), &a, &b);
  a = std::max(a, base_);
  *lo = b > a ? size_t(a - base_) : 0;
  *hi = b > a ? size_t(b - base_) : 0;
}

void SpecTiles::tile(size_t q0, size_t q1, size_t k0, size_t k1, float* out) const {
  mask_tile(s_, sliding_, P_, valid_, int64_t(q0), int64_t(q1), int64_t(k0) + base_, int64_t(k1) + base_, out);
}

}  // namespace models

PrefillMasks build_masks(MaskMode mode, std::span<const uint8_t> is_image, int valid_len, int Lp,
                         int window) {
  if (valid_len < 0 || valid_len > Lp)
    fail("mask: valid length {} outside [0, {}]", valid_len, Lp);
  if (window <= 0) fail("mask: sliding window must be positive, got {}", window);
  if (mode == MaskMode::Hf && is_image.size() < size_t(valid_len))
    fail("mask: {} image flags for {} valid positions", is_image.size(), valid_len);
  models::MaskSpec spec;
  spec.mode = mode;
  spec.window = window;
  if (mode == MaskMode::Hf) {
    spec.group = image_groups(is_image.first(size_t(valid_len)));
    spec.group.resize(size_t(Lp), -1);
  }
  PrefillMasks m;
  m.global = models::dense_mask(spec, false, valid_len, Lp);
  if (mode != MaskMode::Mlx) m.sliding = models::dense_mask(spec, true, valid_len, Lp);
  return m;
}

PrefillMasks build_masks(MaskMode mode, std::span<const int32_t> ids, int valid_len, int Lp,
                         int window, int image_token_id) {
  std::vector<uint8_t> img(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) img[i] = ids[i] == image_token_id;
  return build_masks(mode, img, valid_len, Lp, window);
}

}  // namespace vlm
