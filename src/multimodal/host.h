// The host side of a Gemma 3 request (docs/gemma3/prompt.md, merge-and-scaling.md, masks.md): prompt ids with expanded image
// blocks plus decoded images in, prefill rows and masks (models/batch.h, prefill_input.h)
// out. Every check on the request (soft-token cardinality, context, padding) runs
// before the vision tower or the decoder does any work; a request without images
// never touches the vision tower.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kernels/exec.h"
#include "io/identity.h"
#include "models/gemma3/decoder.h"
#include "models/embedder.h"
#include "models/mask.h"
#include "models/prefill_input.h"
#include "multimodal/merge.h"
#include "text/chat.h"
#include "models/gemma3/vision_encoder.h"

namespace vlm {

// TEST-ONLY fault switches for negative fixtures: each breaks one step on purpose so the tests
// can show that the dumped intermediates (masks, merged rows, embed_norms) catch it. Passed in
// through HostOptions; only the CLI reads them (from VLM_FAULT), never the library.
//   causal_mask          the plain causal mask in place of the configured mode
//   multiplicative_mask  a 0/1 multiplicative mask (1 allowed, 0 blocked) instead of
//                        the additive 0/lowest one
//   double_scale         text rows multiplied by the Gemma normalizer a second time
//   no_image_prescale    image rows get the MLX sequence scale without the division
//                        before the merge (net image scale √H instead of 1)
enum class Fault { None, CausalMask, MultiplicativeMask, DoubleScale, NoImagePrescale };
// "" = None; unknown names are an error listing the known ones.
Fault parse_fault(std::string_view name);

struct HostOptions {
  MaskMode mask_mode = MaskMode::Hf;  // see default_mask_mode() in io/identity.h
  ImageScaling image_scaling = ImageScaling::Reference;
  std::optional<bool> pan_and_scan;  // nullopt: preprocessor_config.json decides
  int pad_to = 0;                    // right-pad the prefill to this many rows (0 = none)
  int64_t context = 0;               // the prompt must fit (0 = max_position_embeddings)
  Fault fault = Fault::None;         // TEST-ONLY
};

// The image tokens of a VLM checkpoint (all -1/0 for a text-only one).
text::ImageTokens image_tokens_of(const ModelConfig& mc, text::ImageLayout layout);

// Pan & Scan crops each image will get (all 0 when Pan & Scan is off).
std::vector<int> crops_per_image(const vision::VisionEncoder& enc, const std::vector<vision::RgbImage>& images,
                                 std::optional<bool> pan_and_scan);

// The user turn of `vlm run --image … --prompt T`: the images first, in order, then the text.
text::ChatMessage user_turn(const std::string& text, size_t n_images);

// The request checks that run before the vision tower or the decoder does any work: images only
// on a VLM with its encoder, exactly mm_tokens_per_image soft tokens per encoded image (each
// image and each of its Pan & Scan crops), the prompt within the context. Returns the indices
// of the image soft tokens.
std::vector<int32_t> check_prompt(const ModelConfig& mc, const vision::VisionEncoder* enc,
                                  std::span<const int32_t> ids, const std::vector<vision::RgbImage>& images,
                                  const HostOptions& opt);

// THE builder of prefill rows: the embedded ids (post-scale) with the image features merged
// into the soft-token rows under the scaling policy. `ids` may include right padding (any
// rows past valid_len); `features` are the projector rows of every encoded image in prompt
// order (empty without images).
std::vector<float> prefill_rows(const TextEmbedder& emb, const ModelConfig& mc, std::span<const int32_t> ids,
                                int valid_len, std::span<const float> features, const HostOptions& opt);

// The dense additive masks over rows whose ids are `ids` (valid_len real, the rest padding), in
// the configured mode (image groups from the soft tokens): what dumps write.
PrefillMasks prefill_masks(const ModelConfig& mc, std::span<const int32_t> ids, int valid_len,
                           const HostOptions& opt);
// The same as the compact description the decoder takes tiles from (a prompt chunk whose ids
// are `ids`). The multiplicative_mask fault has no compact form: then `dense` receives the
// chunk's dense masks and the spec points at them (keep `dense` alive with the spec).
models::MaskSpec prefill_mask_spec(const ModelConfig& mc, std::span<const int32_t> ids, const HostOptions& opt,
                                   PrefillMasks& dense);

struct MultimodalPrefill {
  PrefillInput input;
  std::vector<int32_t> ids;              // prompt ids, unpadded
  std::vector<int32_t> image_positions;  // indices of the image soft tokens
  std::vector<float> embed_norms;        // [valid_len] L2 norm of every merged row
  std::optional<vision::ImageEncoding> encoding;  // when images were given
};

// The whole prefill at once (dumps, tests): checks, encoding, rows and masks, right-padded to
// opt.pad_to rows with the config's pad id. ids: the prompt with every image already expanded
// (soft tokens included); images in prompt order. `enc` may be null when there are no images.
MultimodalPrefill build_prefill(const models::gemma3::Decoder& model, const ModelConfig& mc, const vision::VisionEncoder* enc,
                                std::span<const int32_t> ids, const std::vector<vision::RgbImage>& images,
                                const HostOptions& opt, const kernels::Exec& ex);

// The scaling policy as the compatibility identity names it.
std::string scaling_policy_name(EmbedScaling text, DType embedding_dtype, ImageScaling image);
// The compatibility identity of requests run with these options (what a prompt cache
// or a dump is stamped with).
Identity request_identity(const Checkpoint& ck, const HostOptions& opt, EmbedScaling text = EmbedScaling::Reference);

}  // namespace vlm
