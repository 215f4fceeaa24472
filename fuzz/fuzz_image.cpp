// libFuzzer target: image bytes → decode (every format) → Gemma 3 preprocessing.
// Must hold: decode_image returns an image within the limits or throws vlm::Error;
// preprocessing of what it returns never fails.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "core/error.h"
#include "vision/image.h"
#include "vision/preprocess.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  vlm::vision::DecodeLimits lim;
  lim.max_pixels = 1 << 20;  // small images keep the run fast; the limit logic is the same
  vlm::vision::RgbImage im;
  try {
    im = vlm::vision::decode_image(std::span<const uint8_t>(data, size), "fuzz", lim);
  } catch (const vlm::Error&) {
    return 0;
  }
  if (im.width < 1 || im.height < 1 || uint64_t(im.width) * uint64_t(im.height) > lim.max_pixels ||
      im.rgb.size() != size_t(im.width) * size_t(im.height) * 3)
    std::abort();
  vlm::PreprocessorConfig pp;
  pp.height = pp.width = 28;
  pp.do_pan_and_scan = true;
  pp.pan_and_scan_min_crop_size = 4;
  const vlm::vision::PixelBatch b = vlm::vision::preprocess({im}, pp);
  for (float v : b.values)
    if (!(v >= -1.f && v <= 1.f)) std::abort();
  return 0;
}
