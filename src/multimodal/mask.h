// Additive prefill masks (spec §9): 0.0 = allowed, lowest finite f32 = disallowed.
// Stored [Lp, Lp] row-major (row = query); canonical shape [1, 1, Lp, Lp].
// Padded positions (index ≥ valid_len) are disallowed as keys and as query rows.
#pragma once
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>
#include <vector>

namespace vlm {

constexpr float kMaskAllowed = 0.0f;
constexpr float kMaskBlocked = std::numeric_limits<float>::lowest();

enum class MaskMode {
  Causal,  // k ≤ q; sliding layers also q − k < W (text)
  Hf,      // (k ≤ q ∨ same image group); sliding layers also q − k < W, after the OR (§9.2)
  Mlx,     // every valid pair allowed, one mask for every layer (§9.6)
};
MaskMode parse_mask_mode(std::string_view s);  // "causal" | "hf" | "mlx"
std::string_view mask_mode_name(MaskMode m);

struct PrefillMasks {
  std::vector<float> global;   // [Lp, Lp]
  std::vector<float> sliding;  // [Lp, Lp]; empty = the global mask serves sliding layers too
};

// is_image[j] for j < valid_len marks image soft tokens (only Hf uses it).
PrefillMasks build_masks(MaskMode mode, std::span<const uint8_t> is_image, int valid_len, int Lp,
                         int window);
// Same, marking ids equal to image_token_id as image tokens.
PrefillMasks build_masks(MaskMode mode, std::span<const int32_t> ids, int valid_len, int Lp,
                         int window, int image_token_id);

}  // namespace vlm
