// HF Gemma3ImageProcessor (slow, PIL path; docs/gemma3/preprocessing.md) on decoded RGB images:
// optional Pan & Scan crops, PIL-exact antialiased bilinear resize with 8-bit
// results, rescale f32(f64(u8)·factor), normalize (x − mean)/std in f32, CHW.
#pragma once
#include <vector>

#include "io/config.h"
#include "vision/image.h"

namespace vlm::vision {

struct CropBox {
  int x = 0, y = 0, w = 0, h = 0;
};

// Pan & Scan crops (docs/gemma3/preprocessing.md#pan-and-scan) for an image of
// width × height, row-major; empty when Pan & Scan does not apply. Uses the
// pan_and_scan_* fields of `pp`.
std::vector<CropBox> pan_and_scan_crops(int width, int height, const PreprocessorConfig& pp);
RgbImage crop(const RgbImage& im, const CropBox& box);

// Pillow's Image.resize(size, BILINEAR) on an RGB image, bit for bit: separable
// triangle filter widened by the downscale factor, weights in 22-bit fixed point,
// horizontal pass first into an 8-bit intermediate, a pass skipped when its size
// is unchanged.
RgbImage resize_bilinear(const RgbImage& im, int out_w, int out_h);

// Rescale + normalize + HWC→CHW of an image already at the target size into
// out[3 · h · w].
void to_pixel_values(const RgbImage& im, const PreprocessorConfig& pp, float* out);

struct PixelBatch {
  int count = 0;              // images after Pan & Scan expansion
  int height = 0, width = 0;  // per image
  std::vector<float> values;  // [count, 3, height, width]
  std::vector<int> num_crops;  // per input image (0 without Pan & Scan)
};

// The whole processor over a list of images, in order: each image followed by its
// crops when pp.do_pan_and_scan is set. Checks the config fields it uses.
PixelBatch preprocess(const std::vector<RgbImage>& images, const PreprocessorConfig& pp);

}  // namespace vlm::vision
