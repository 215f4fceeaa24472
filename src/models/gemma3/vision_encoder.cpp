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
  Job job = start(images, ex, pan_and_scan);
  advance(job, size_t(tower_.num_layers()), ex);
  return std::move(job.result);
}

VisionEncoder::Job VisionEncoder::start(const std::vector<RgbImage>& images, const kernels::Exec& ex,
                                        std::optional<bool> pan_and_scan) const {
  PreprocessorConfig pp = pp_;
  if (pan_and_scan) pp.do_pan_and_scan = *pan_and_scan;
  Job job;
  ImageEncoding& e = job.result;
  e.pixels = preprocess(images, pp);
  e.patches = tower_.num_patches();
  e.vision_hidden = tower_.hidden();
  e.tokens = proj_.tokens();
  e.hidden = proj_.out_dim();
  if (e.pixels.count == 0) {
    job.done = true;
    return job;
  }
  job.pass = tower_.begin(e.pixels.values.data(), e.pixels.count, ex);
  return job;
}

size_t VisionEncoder::advance(Job& job, size_t layers, const kernels::Exec& ex) const {
  if (job.done) return 0;
  const size_t ran = tower_.advance(job.pass, layers, ex);
  if (tower_.done(job.pass)) {
    ImageEncoding& e = job.result;
    e.vision_raw = tower_.finish(std::move(job.pass), ex);
    e.features = proj_.forward(e.vision_raw.data(), e.pixels.count, ex);
    job.done = true;
  }
  return ran;
}

}  // namespace vlm::vision
