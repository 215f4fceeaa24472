#include "vision/preprocess.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/error.h"

namespace vlm::vision {

namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // Pillow: 8-bit result, 2 bits headroom

// Per output index: the first source index, the tap count and the fixed-point taps.
struct Taps {
  std::vector<int> first, count;
  std::vector<size_t> offset;
  std::vector<int32_t> w;
};

// Pillow's precompute_coeffs for the BILINEAR filter (support 1) followed by
// normalize_coeffs_8bpc. The box edge arrives as a C float, as in Pillow.
Taps bilinear_taps(int in_size, int out_size) {
  const double scale = double(float(in_size)) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = 1.0 * filterscale;
  const double ss = 1.0 / filterscale;
  Taps t;
  t.first.resize(size_t(out_size));
  t.count.resize(size_t(out_size));
  t.offset.resize(size_t(out_size));
  std::vector<double> k;
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    int xmin = int(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = int(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    k.assign(size_t(std::max(xmax, 0)), 0.0);
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      double a = std::fabs((x + xmin - center + 0.5) * ss);
      const double w = a < 1.0 ? 1.0 - a : 0.0;
      k[size_t(x)] = w;
      ww += w;
    }
    t.first[size_t(xx)] = xmin;
    t.count[size_t(xx)] = std::max(xmax, 0);
    t.offset[size_t(xx)] = t.w.size();
    for (double v : k) {
      if (ww != 0.0) v /= ww;
      t.w.push_back(v < 0 ? int32_t(-0.5 + v * (1 << kPrecisionBits))
                          : int32_t(0.5 + v * (1 << kPrecisionBits)));
    }
  }
  return t;
}

inline uint8_t clip8(int32_t v) { return uint8_t(std::clamp(v >> kPrecisionBits, 0, 255)); }

// out row `yy` (width out_w) from in rows y0+..., for channels interleaved by 3.
void horizontal(const RgbImage& in, int y0, int rows, const Taps& t, RgbImage& out) {
  const int ow = out.width;
  for (int yy = 0; yy < rows; ++yy) {
    const uint8_t* s = in.rgb.data() + size_t(y0 + yy) * size_t(in.width) * 3;
    uint8_t* d = out.rgb.data() + size_t(yy) * size_t(ow) * 3;
    for (int xx = 0; xx < ow; ++xx) {
      const int32_t* k = &t.w[t.offset[size_t(xx)]];
      const uint8_t* p = s + size_t(t.first[size_t(xx)]) * 3;
      int32_t a0 = 1 << (kPrecisionBits - 1), a1 = a0, a2 = a0;
      for (int x = 0; x < t.count[size_t(xx)]; ++x) {
        a0 += p[3 * x] * k[x];
        a1 += p[3 * x + 1] * k[x];
        a2 += p[3 * x + 2] * k[x];
      }
      d[3 * xx] = clip8(a0), d[3 * xx + 1] = clip8(a1), d[3 * xx + 2] = clip8(a2);
    }
  }
}

// Taps index rows of `in` shifted by y_shift (the rows the horizontal pass kept).
void vertical(const RgbImage& in, int y_shift, const Taps& t, RgbImage& out) {
  const size_t rowlen = size_t(in.width) * 3;
  for (int yy = 0; yy < out.height; ++yy) {
    const int32_t* k = &t.w[t.offset[size_t(yy)]];
    const uint8_t* s = in.rgb.data() + size_t(t.first[size_t(yy)] - y_shift) * rowlen;
    uint8_t* d = out.rgb.data() + size_t(yy) * rowlen;
    for (size_t i = 0; i < rowlen; ++i) {
      int32_t a = 1 << (kPrecisionBits - 1);
      for (int y = 0; y < t.count[size_t(yy)]; ++y) a += s[size_t(y) * rowlen + i] * k[y];
      d[i] = clip8(a);
    }
  }
}

RgbImage blank(int w, int h) {
  RgbImage im;
  im.width = w;
  im.height = h;
  im.rgb.assign(size_t(w) * size_t(h) * 3, 0);
  return im;
}

}  // namespace

RgbImage resize_bilinear(const RgbImage& im, int out_w, int out_h) {
  if (out_w < 1 || out_h < 1) fail("resize: target size {}x{} must be positive", out_w, out_h);
  if (im.width < 1 || im.height < 1) fail("resize: source image is empty");
  if (im.width == out_w && im.height == out_h) return im;
  const Taps th = bilinear_taps(im.width, out_w);
  const Taps tv = bilinear_taps(im.height, out_h);
  const bool need_h = out_w != im.width, need_v = out_h != im.height;
  if (!need_h) {
    RgbImage out = blank(out_w, out_h);
    vertical(im, 0, tv, out);
    return out;
  }
  // Only the source rows some output row reads go through the horizontal pass.
  const int y_first = tv.first.front();
  const int y_last = tv.first.back() + tv.count.back();
  if (!need_v) {
    RgbImage out = blank(out_w, out_h);
    horizontal(im, 0, out_h, th, out);
    return out;
  }
  RgbImage tmp = blank(out_w, y_last - y_first);
  horizontal(im, y_first, y_last - y_first, th, tmp);
  RgbImage out = blank(out_w, out_h);
  vertical(tmp, y_first, tv, out);
  return out;
}

std::vector<CropBox> pan_and_scan_crops(int width, int height, const PreprocessorConfig& pp) {
  const int min_crop = pp.pan_and_scan_min_crop_size, max_crops = pp.pan_and_scan_max_num_crops;
  const double min_ratio = pp.pan_and_scan_min_ratio_to_activate;
  if (min_crop < 1) fail("pan_and_scan_min_crop_size must be >= 1 (got {})", min_crop);
  if (max_crops < 1) fail("pan_and_scan_max_num_crops must be >= 1 (got {})", max_crops);
  const double w = width, h = height;
  int nw = 1, nh = 1;
  if (width >= height) {
    if (w / h < min_ratio) return {};
    nw = int(std::floor(w / h + 0.5));
    nw = std::min(int(std::floor(w / min_crop)), nw);
    nw = std::min(max_crops, std::max(2, nw));
  } else {
    if (h / w < min_ratio) return {};
    nh = int(std::floor(h / w + 0.5));
    nh = std::min(int(std::floor(h / min_crop)), nh);
    nh = std::min(max_crops, std::max(2, nh));
  }
  const int cw = int(std::ceil(w / nw)), ch = int(std::ceil(h / nh));
  if (std::min(cw, ch) < min_crop) return {};
  std::vector<CropBox> out;
  for (int r = 0; r < nh; ++r)
    for (int c = 0; c < nw; ++c) {
      CropBox b{c * cw, r * ch, 0, 0};
      // Slicing past the edge clips, as numpy does.
      b.w = std::max(0, std::min(cw, width - b.x));
      b.h = std::max(0, std::min(ch, height - b.y));
      out.push_back(b);
    }
  return out;
}

RgbImage crop(const RgbImage& im, const CropBox& b) {
  if (b.x < 0 || b.y < 0 || b.w < 1 || b.h < 1 || b.x + b.w > im.width || b.y + b.h > im.height)
    fail("crop {}x{}+{}+{} lies outside the {}x{} image", b.w, b.h, b.x, b.y, im.width, im.height);
  RgbImage out = blank(b.w, b.h);
  for (int y = 0; y < b.h; ++y)
    std::copy_n(im.rgb.data() + (size_t(b.y + y) * size_t(im.width) + size_t(b.x)) * 3,
                size_t(b.w) * 3, out.rgb.data() + size_t(y) * size_t(b.w) * 3);
  return out;
}

void to_pixel_values(const RgbImage& im, const PreprocessorConfig& pp, float* out) {
  const size_t n = size_t(im.width) * size_t(im.height);
  for (int c = 0; c < 3; ++c) {
    const float mean = pp.image_mean[c], std = pp.image_std[c];
    float* o = out + size_t(c) * n;
    for (size_t i = 0; i < n; ++i) {
      float v = im.rgb[3 * i + size_t(c)];
      if (pp.do_rescale) v = float(double(im.rgb[3 * i + size_t(c)]) * pp.rescale_factor);
      if (pp.do_normalize) v = (v - mean) / std;
      o[i] = v;
    }
  }
}

PixelBatch preprocess(const std::vector<RgbImage>& images, const PreprocessorConfig& pp) {
  if (pp.height < 1 || pp.width < 1)
    fail("preprocessor_config.json: size {}x{} must be positive", pp.height, pp.width);
  if (pp.do_resize && pp.resample != 2)
    fail("preprocessor_config.json: resample {} is not supported (only 2 = BILINEAR)", pp.resample);
  for (int c = 0; c < 3; ++c)
    if (pp.do_normalize && !(pp.image_std[c] != 0.f))
      fail("preprocessor_config.json: image_std[{}] must be non-zero", c);
  PixelBatch b;
  b.height = pp.height;
  b.width = pp.width;
  std::vector<RgbImage> crops;
  std::vector<std::pair<size_t, bool>> items;  // (index, is a crop)
  for (size_t n = 0; n < images.size(); ++n) {
    const RgbImage& im = images[n];
    std::vector<CropBox> boxes;
    if (pp.do_pan_and_scan) boxes = pan_and_scan_crops(im.width, im.height, pp);
    b.num_crops.push_back(int(boxes.size()));
    items.emplace_back(n, false);
    for (const CropBox& box : boxes) {
      items.emplace_back(crops.size(), true);
      crops.push_back(crop(im, box));
    }
  }
  b.count = int(items.size());
  const size_t per = size_t(3) * size_t(pp.height) * size_t(pp.width);
  b.values.resize(per * items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const RgbImage& im = items[i].second ? crops[items[i].first] : images[items[i].first];
    if (!pp.do_resize && (im.width != pp.width || im.height != pp.height))
      fail("image {} is {}x{} but do_resize is false and the model needs {}x{}", i, im.width,
           im.height, pp.width, pp.height);
    to_pixel_values(pp.do_resize ? resize_bilinear(im, pp.width, pp.height) : im, pp,
                    b.values.data() + per * i);
  }
  return b;
}

}  // namespace vlm::vision
