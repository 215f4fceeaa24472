// Images in, projected image features out: the path `vlm dump --image`, `vlm run`
// and the server share. Decoding lives in image.h, the processor in preprocess.h.
#pragma once
#include <optional>
#include <vector>

#include "kernels/exec.h"
#include "io/checkpoint.h"
#include "vision/image.h"
#include "vision/preprocess.h"
#include "models/gemma3/projector.h"
#include "vision/siglip.h"

namespace vlm::vision {

struct ImageEncoding {
  PixelBatch pixels;                // pixel_values [n, 3, S, S] (+ num_crops per input image)
  int patches = 0, vision_hidden = 0;
  std::vector<float> vision_raw;   // [n, P, Hv] after the post-layernorm
  int tokens = 0, hidden = 0;
  std::vector<float> features;     // [n, T, H] projector output, before any merge scaling
};

class VisionEncoder {
 public:
  // Needs a checkpoint opened with the vision part. The processor settings come
  // from preprocessor_config.json; without one, HF's defaults at the tower's size.
  explicit VisionEncoder(const Checkpoint& ck);

  const PreprocessorConfig& processor() const { return pp_; }
  const SiglipTower& tower() const { return tower_; }
  const Projector& projector() const { return proj_; }

  // All images (and their Pan & Scan crops, when enabled by the config or by
  // `pan_and_scan`) go through the tower as one batch.
  ImageEncoding encode(const std::vector<RgbImage>& images, const kernels::Exec& ex,
                       std::optional<bool> pan_and_scan = std::nullopt) const;

  // encode() in pieces (the engine runs other sequences' steps between them): start()
  // preprocesses and embeds the patches, advance() runs up to `layers` tower layers and returns
  // how many ran, and once the tower is done it runs the projector and `job.result` is complete.
  struct Job {
    ImageEncoding result;
    SiglipTower::Pass pass;
    bool done = false;
  };
  Job start(const std::vector<RgbImage>& images, const kernels::Exec& ex,
            std::optional<bool> pan_and_scan = std::nullopt) const;
  size_t advance(Job& job, size_t layers, const kernels::Exec& ex) const;

 private:
  PreprocessorConfig pp_;
  SiglipTower tower_;
  Projector proj_;
};

}  // namespace vlm::vision
