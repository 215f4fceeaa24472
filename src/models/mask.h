// Additive prefill masks (transformers gemma3 create_causal_mask with
// token_type_ids_mask_function; sliding_window_overlay): 0.0 = allowed, lowest finite f32 = blocked.
//
// A mask is held as a compact description (MaskSpec: mode, window, image group per new
// row) from which attention takes exact additive tiles for the block of rows it computes,
// so a long prompt never holds an O(L²) array. The dense [Lp, Lp] form (canonical shape
// [1, 1, Lp, Lp], row = query) stays available for dumps and tests, and a caller may pass
// explicit dense masks through the same door.
// Padded positions (index ≥ valid_len) are blocked as keys and as query rows.
#pragma once
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>
#include <vector>

#include "nn/attention.h"

namespace vlm {

constexpr float kMaskAllowed = 0.0f;
constexpr float kMaskBlocked = std::numeric_limits<float>::lowest();

enum class MaskMode {
  Causal,  // k ≤ q; sliding layers also q − k < W (text)
  Hf,      // (k ≤ q ∨ same image group); sliding layers also q − k < W, after the OR
  Mlx,     // every valid pair allowed, one mask for every layer (one-shot prefill only)
};
MaskMode parse_mask_mode(std::string_view s);  // "causal" | "hf" | "mlx"
std::string_view mask_mode_name(MaskMode m);

// Image-group id per position: the ordinal of the contiguous image run holding it, −1 for
// text (transformers' token_type_ids_mask_function groups by contiguous image runs).
std::vector<int32_t> image_groups(std::span<const uint8_t> is_image);
std::vector<int32_t> image_groups(std::span<const int32_t> ids, int32_t image_token_id);

namespace models {

// How a sequence's new rows attend (compact and exact).
struct MaskSpec {
  MaskMode mode = MaskMode::Causal;
  std::vector<int32_t> group;  // per new row: image-group id (>= 0) or -1 (Hf only; may be empty)
  int window = 0;              // sliding window W (from the config)
  // Test/explicit door: dense additive [Lp, Lp] masks over the new rows (sliding null =
  // global serves both). When set they are used cell for cell for the new keys; cached keys
  // follow the continuation rule below.
  const std::vector<float>* dense_global = nullptr;
  const std::vector<float>* dense_sliding = nullptr;
};

// The exact additive tile rows [q0, q1) × keys [k0, k1) of a chunk whose first row sits at
// position P: row q is position P + q, key k is position k (cached keys are k < P; new key
// j of the chunk is k = P + j). Rows ≥ valid_len and new keys ≥ valid_len are blocked.
// Cached keys are the chunk's past: allowed on global layers, within the window on sliding
// ones (q − k < W). out is [(q1 − q0), (k1 − k0)] row-major.
void mask_tile(const MaskSpec& spec, bool sliding_layer, int64_t P, int valid_len, int64_t q0, int64_t q1,
               int64_t k0, int64_t k1, float* out);

// Keys [lo, hi) (positions) holding every allowed entry of row q; lo >= hi when none.
void mask_row_span(const MaskSpec& spec, bool sliding_layer, int64_t P, int valid_len, int64_t q, int64_t* lo,
                   int64_t* hi);

// The dense [Lp, Lp] form of a first chunk (P = 0), for dumps and tests.
std::vector<float> dense_mask(const MaskSpec& spec, bool sliding_layer, int valid_len, int Lp);

// Fails (naming both values) when the spec cannot describe a chunk of `rows` rows at P.
void check_mask_spec(const MaskSpec& spec, int64_t P, int rows);
// A spec's tiles as attention takes them, for a chunk at P over a key buffer whose index k
// holds position base + k (base > 0: the buffer starts past the positions no row can reach).
class SpecTiles final : public nn::MaskTiles {
 public:
  SpecTiles(const MaskSpec& s, bool sliding, int64_t P, int valid, int64_t base)
      : s_(s), sliding_(sliding), P_(P), valid_(valid), base_(base) {}
  void row_span(size_t q, size_t* lo, size_t* hi) const override;
  void tile(size_t q0, size_t q1, size_t k0, size_t k1, float* out) const override;

 private:
  const MaskSpec& s_;
  bool sliding_;
  int64_t P_;
  int valid_;
  int64_t base_;
};

}  // namespace models

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
