#include "models/gemma3/vision_encoder.h"

#include "core/error.h"

namespace vlm::vision {

namespace {
PreprocessorConfig processor_of(const Checkpoint& ck) {
  if (!ck.config().vision) fail("{}: config.json has no vision_config (not a Gemma 3 VLM)", ck.dir().string());
  return effective_preprocessor(ck.config());
}
}  // namespace

VisionEncoder::VisionEncoder(const Checkpoint& ck) : pp_(processor_of(ck)), tower_(ck), proj_(ck) {
  if (pp_.height != tower_.image_size() || pp_.width != tower_.image_size())
    fail("preprocessor_config.json: size {}x{} does not match vision_config.image_size {}", pp_.height,
         pp_.width, tower_.image_size());
}

ImageEncoding VisionEncoder::encode(const std::vector<RgbImage>& images, const kernels::Exec& ex,
                                    std::optional<bool> pan_and_scan) const {
  PreprocessorConfig pp = pp_;
  if (pan_and_scan) pp.do_pan_and_scan = *pan_and_scan;
  ImageEncoding e;
  e.pixels = preprocess(images, pp);
  const int n = e.pixels.count;
  e.patches = tower_.num_patches();
  e.vision_hidden = tower_.hidden();
  e.tokens = proj_.tokens();
  e.hidden = proj_.out_dim();
  if (n == 0) return e;
  e.vision_raw = tower_.forward(e.pixels.values.data(), n, ex);
  e.features = proj_.forward(e.vision_raw.data(), n, ex);
  return e;
}

}  // namespace vlm::vision
