// Vision unit tests: Pillow resize arithmetic worked by hand from
// docs/gemma3/preprocessing.md#resize, Pan & Scan boxes from
// docs/gemma3/preprocessing.md#pan-and-scan, decode limits, and config validation of the tower and projector.
// (Pixel-for-pixel agreement with PIL over every format lives in tests/oracle/test_vision.py.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "kernels/exec.h"
#include "model_folder.h"
#include "models/gemma3/registry.h"
#include "models/gemma3/vision_encoder.h"

namespace vlm::vision {
namespace {

RgbImage gray_row(std::vector<uint8_t> v, int h = 1) {
  RgbImage im;
  im.width = int(v.size());
  im.height = h;
  for (int y = 0; y < h; ++y)
    for (uint8_t x : v) im.rgb.insert(im.rgb.end(), {x, x, x});
  return im;
}

// A bottom-up 24-bit BMP of w x h whose pixel (x, y) is (x, y, 7).
std::vector<uint8_t> bmp24(int w, int h) {
  const int stride = (w * 3 + 3) & ~3;
  std::vector<uint8_t> b(54 + size_t(stride) * size_t(h), 0);
  auto put32 = [&](size_t o, uint32_t v) { std::memcpy(&b[o], &v, 4); };
  b[0] = 'B', b[1] = 'M';
  put32(2, uint32_t(b.size()));
  put32(10, 54);
  put32(14, 40);
  put32(18, uint32_t(w));
  put32(22, uint32_t(h));
  b[26] = 1, b[28] = 24;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      uint8_t* p = &b[54 + size_t(h - 1 - y) * size_t(stride) + size_t(x) * 3];
      p[0] = 7, p[1] = uint8_t(y), p[2] = uint8_t(x);  // B, G, R
    }
  return b;
}

TEST(Resize, DownscaleAveragesWithRoundHalfUp) {
  // 2 -> 1: scale 2, taps 0.5/0.5 = 2^21 each; (0 + 255)·2^21 + 2^21 >> 22 = 128.
  RgbImage out = resize_bilinear(gray_row({0, 255}), 1, 1);
  EXPECT_EQ(out.rgb, (std::vector<uint8_t>{128, 128, 128}));
}

TEST(Resize, UpscaleTapsWorkedByHand) {
  // 2 -> 4: centres 0.25, 0.75, 1.25, 1.75; taps {1}, {.75,.25}, {.25,.75}, {1};
  // 0.25·255 = 63.75 -> (2^21 + 255·2^20) >> 22 = 64, 0.75·255 = 191.25 -> 191.
  RgbImage out = resize_bilinear(gray_row({0, 255}), 4, 1);
  const uint8_t want[] = {0, 64, 191, 255};
  for (int x = 0; x < 4; ++x) EXPECT_EQ(out.rgb[3 * size_t(x)], want[x]) << x;
}

TEST(Resize, VerticalOnlyAndOnePixel) {
  RgbImage col = gray_row({10}, 1);
  RgbImage big = resize_bilinear(col, 5, 7);
  EXPECT_EQ(big.width, 5);
  EXPECT_EQ(big.height, 7);
  for (uint8_t v : big.rgb) EXPECT_EQ(v, 10);
  RgbImage same = resize_bilinear(gray_row({1, 2, 3}), 3, 1);
  EXPECT_EQ(same.rgb, gray_row({1, 2, 3}).rgb);
  EXPECT_THROW(resize_bilinear(col, 0, 3), Error);
}

TEST(Normalize, SpecValues) {
  PreprocessorConfig pp;
  RgbImage im = gray_row({0, 1, 127, 128, 255});
  std::vector<float> out(15);
  to_pixel_values(im, pp, out.data());
  const float want[] = {-1.0f, -0.99215686f, -0.0039215684f, 0.0039216280f, 1.0f};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(out[size_t(i)], want[i]) << i;
  // The f32 rounding of the rescale matters (docs/gemma3/preprocessing.md#rescale).
  EXPECT_NE(out[3], float(2.0 * 128 / 255 - 1));
}

TEST(PanAndScan, SpecExamples) {
  PreprocessorConfig pp;  // defaults: 256, 4, 1.2
  struct Case {
    int w, h;
    size_t n;
  };
  for (Case c : {Case{1792, 896, 2}, Case{1000, 300, 3}, Case{600, 300, 2}, Case{500, 300, 0},
                 Case{300, 900, 3}, Case{896, 896, 0}})
    EXPECT_EQ(pan_and_scan_crops(c.w, c.h, pp).size(), c.n) << c.w << "x" << c.h;
  const auto b = pan_and_scan_crops(1000, 300, pp);
  ASSERT_EQ(b.size(), 3u);
  const int xs[] = {0, 334, 668}, ws[] = {334, 334, 332};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(b[size_t(i)].x, xs[i]);
    EXPECT_EQ(b[size_t(i)].w, ws[i]);
    EXPECT_EQ(b[size_t(i)].y, 0);
    EXPECT_EQ(b[size_t(i)].h, 300);
  }
  const auto p = pan_and_scan_crops(300, 900, pp);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[2].y, 600);
  EXPECT_EQ(p[2].h, 300);
}

TEST(Decode, BmpPixelsAndLimits) {
  const auto bytes = bmp24(100, 100);
  RgbImage im = decode_image(bytes, "t.bmp");
  ASSERT_EQ(im.width, 100);
  const uint8_t* px = &im.rgb[(size_t(5) * 100 + 9) * 3];  // (x 9, y 5)
  EXPECT_EQ(px[0], 9);
  EXPECT_EQ(px[1], 5);
  EXPECT_EQ(px[2], 7);
  DecodeLimits lim;
  lim.max_pixels = 9999;
  try {
    decode_image(bytes, "t.bmp", lim);
    FAIL() << "limit not applied";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds the limit of 9999 pixels"), std::string::npos) << e.what();
  }
  lim.max_pixels = 10000;
  EXPECT_NO_THROW(decode_image(bytes, "t.bmp", lim));
  lim.max_bytes = bytes.size() - 1;
  EXPECT_THROW(decode_image(bytes, "t.bmp", lim), Error);
}

TEST(Decode, EmptyAndUnknown) {
  try {
    decode_image({}, "nothing");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nothing: empty"), std::string::npos) << e.what();
  }
  const uint8_t junk[] = {'h', 'e', 'l', 'l', 'o'};
  EXPECT_THROW(decode_image(junk, "junk"), Error);
  const uint8_t tiny_png[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0};
  EXPECT_THROW(decode_image(tiny_png, "cut.png"), Error);
}

TEST(Decode, Bmp16UsesPilScaling) {
  // 5-bit value 4 -> 4·255/31 = 32 (PIL's integer formula), not 33 (bit replication).
  auto b = bmp24(1, 1);
  b[28] = 16;                      // 16 bits per pixel, BI_RGB = x555
  const uint16_t v = 4 << 10 | 4 << 5 | 4;
  std::memcpy(&b[54], &v, 2);
  RgbImage im = decode_image(b, "t16.bmp");
  EXPECT_EQ(im.rgb, (std::vector<uint8_t>{32, 32, 32}));
}

// A copy of the tiny-f32 fixture with config.json edited by `edit`.
std::string edited_fixture(const test::TempDir& dir, const std::function<void(nlohmann::json&)>& edit) {
  const char* fx = std::getenv("VLM_FIXTURES");
  if (!fx) return "";
  const std::filesystem::path src = std::filesystem::path(fx) / "tiny-f32";
  for (const auto& e : std::filesystem::directory_iterator(src)) {
    const auto name = e.path().filename();
    if (name == "config.json") continue;
    std::filesystem::create_symlink(std::filesystem::absolute(e.path()), dir.path / name);
  }
  std::ifstream in(src / "config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  edit(j);
  std::ofstream(dir.path / "config.json") << j.dump(2);
  return dir.path.string();
}

void expect_field_error(const std::function<void(nlohmann::json&)>& edit, const std::string& field) {
  test::TempDir dir;
  const std::string path = edited_fixture(dir, edit);
  if (path.empty()) GTEST_SKIP() << "VLM_FIXTURES not set";
  try {
    Checkpoint ck = models::gemma3::open_checkpoint(path);
    VisionEncoder enc(ck);
    FAIL() << "accepted a config with a bad " << field;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

TEST(VisionConfig, BadValuesNameTheField) {
  expect_field_error([](nlohmann::json& j) { j["vision_config"]["num_attention_heads"] = 3; },
                     "num_attention_heads");
  expect_field_error([](nlohmann::json& j) { j["vision_config"]["hidden_act"] = "relu"; }, "hidden_act");
  expect_field_error([](nlohmann::json& j) { j["vision_config"]["patch_size"] = 7; }, "patch_size");
  expect_field_error([](nlohmann::json& j) { j["mm_tokens_per_image"] = 15; }, "mm_tokens_per_image");
  expect_field_error([](nlohmann::json& j) { j["mm_tokens_per_image"] = 9; }, "mm_tokens_per_image");
  expect_field_error([](nlohmann::json& j) { j["vision_config"]["layer_norm_eps"] = -1; }, "layer_norm_eps");
  // A width that no tensor has: the error names a tensor and the config's shape for it.
  expect_field_error([](nlohmann::json& j) { j["vision_config"]["hidden_size"] = 48; }, "[48");
  expect_field_error([](nlohmann::json& j) { j["vision_config"]["num_hidden_layers"] = 3; }, "layers.2");
}

TEST(VisionEncoder, EncodesTinyImage) {
  const char* fx = std::getenv("VLM_FIXTURES");
  if (!fx) GTEST_SKIP() << "VLM_FIXTURES not set";
  Checkpoint ck = models::gemma3::open_checkpoint(std::filesystem::path(fx) / "tiny-bf16");
  VisionEncoder enc(ck);
  ThreadPool pool(2);
  const ImageEncoding e = enc.encode({gray_row({0, 50, 100, 200}, 3)}, pool);
  EXPECT_EQ(e.pixels.count, 1);
  EXPECT_EQ(e.vision_raw.size(), size_t(e.patches) * size_t(e.vision_hidden));
  EXPECT_EQ(e.features.size(), size_t(e.tokens) * size_t(e.hidden));
  for (float v : e.features) ASSERT_TRUE(std::isfinite(v));
  EXPECT_EQ(enc.encode({}, pool).pixels.count, 0);
}

// Under --precision bf16 every route of AVX512-BF16 (kernels::Bf16Gemm: the FMAs, the dot, the AMX
// tiles and their scalar model) computes the same products, summed in other orders: the features
// agree to f32 summation, but for a probability on a bf16 rounding boundary that rounds the other
// way (attention test: up to 4e-3 of the largest value). Two images of 64 patches: the matrices
// past the tiles' 32 rows. The tiny tower in bf16 and in f16 (on the tiles as pairs of bf16).
TEST(VisionEncoder, EveryBf16RouteAgrees) {
  const char* fx = std::getenv("VLM_FIXTURES");
  if (!fx) GTEST_SKIP() << "VLM_FIXTURES not set";
  if (!kernels::bf16_dot_supported()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  ThreadPool pool(2);
  const std::vector<RgbImage> images{gray_row({0, 50, 100, 200}, 3), gray_row({250, 10, 90}, 5)};
  // tiny-bf16's tower as an f16 mmproj: f16 matrices whose values are bf16 values, which the bf16
  // GEMMs take as bf16 (docs/gguf.md, "f16 weights that are bf16 values").
  test::TempDir tmp;
  const std::filesystem::path src = std::filesystem::path(fx) / "tiny-bf16";
  const std::string cmd = "/usr/bin/python3 " + std::string(VLM_SOURCE_DIR) + "/tools/convert_hf_to_gguf.py '" +
                          src.string() + "' --type bf16 --out '" + (tmp / "m.gguf").string() + "' --mmproj-out '" +
                          (tmp / "p.gguf").string() + "' --mmproj-type f16";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  for (const char* name : {"tiny-bf16", "tiny-f16", "f16 mmproj of tiny-bf16"}) {
    SCOPED_TRACE(name);
    const bool mmproj = std::string_view(name).starts_with("f16 mmproj");
    Checkpoint ck = mmproj ? models::gemma3::open_checkpoint(tmp / "m.gguf", {}, tmp / "p.gguf")
                           : models::gemma3::open_checkpoint(std::filesystem::path(fx) / name);
    VisionEncoder enc(ck);
    auto features = [&](kernels::Bf16Gemm gemm) {
      kernels::Exec ex(pool, kernels::Isa::Avx512, kernels::Precision::Bf16);
      ex.bf16_gemm = gemm;
      return enc.encode(images, ex).features;
    };
    const std::vector<float> fma = features(kernels::Bf16Gemm::Fma), dot = features(kernels::Bf16Gemm::Dot);
    double top = 0;
    for (float v : fma) top = std::max(top, double(std::fabs(v)));
    auto distance = [&](const std::vector<float>& a, const std::vector<float>& b) {
      double worst = 0;
      for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(double(a[i]) - b[i]) / top);
      return worst;
    };
    EXPECT_LT(distance(dot, fma), 4e-3);
    for (kernels::Bf16Gemm gemm : {kernels::Bf16Gemm::Amx, kernels::Bf16Gemm::AmxModel}) {
      if (gemm == kernels::Bf16Gemm::Amx && !kernels::amx_supported()) continue;
      const std::vector<float> f = features(gemm);
      ASSERT_EQ(f.size(), fma.size());
      EXPECT_LT(distance(f, fma), 4e-3) << kernels::bf16_gemm_name(gemm);
      // The model sums pairs in the order vdpbf16ps does, K blocks as the dot GEMM: here (no
      // interleaved value tail) the dot's bf16 features to the bit (2e-3 from the FMAs'; 0.99 with
      // the model's even products left out). tiny-f16's matrices run on the f32 GEMM under Dot;
      // the f16 mmproj's take the bf16 GEMMs as bf16 ones do (2e-3 when Dot ignores that).
      if (gemm == kernels::Bf16Gemm::AmxModel && std::string_view(name) != "tiny-f16")
        EXPECT_LT(distance(f, dot), 1e-6);
    }
  }
}

// The encode in pieces (what the engine runs between other sequences' steps) is the same
// operations in the same order: bit-identical tower output and features, one layer at a time.
TEST(VisionEncoder, InPiecesEqualsWholeBitForBit) {
  const char* fx = std::getenv("VLM_FIXTURES");
  if (!fx) GTEST_SKIP() << "VLM_FIXTURES not set";
  Checkpoint ck = models::gemma3::open_checkpoint(std::filesystem::path(fx) / "tiny-f32");
  VisionEncoder enc(ck);
  ThreadPool pool(2);
  const std::vector<RgbImage> images{gray_row({0, 50, 100, 200}, 3), gray_row({250, 10, 90}, 5)};
  const ImageEncoding whole = enc.encode(images, pool);
  VisionEncoder::Job job = enc.start(images, pool);
  size_t ran = 0, calls = 0;
  while (!job.done) {
    const size_t r = enc.advance(job, 1, pool);
    ASSERT_EQ(r, 1u);
    ran += r;
    ++calls;
  }
  EXPECT_EQ(ran, size_t(enc.tower().num_layers()));
  EXPECT_GE(calls, 2u);
  EXPECT_EQ(enc.advance(job, 1, pool), 0u);
  EXPECT_EQ(job.result.vision_raw, whole.vision_raw);
  EXPECT_EQ(job.result.features, whole.features);
  EXPECT_THROW(enc.tower().finish(enc.tower().begin(whole.pixels.values.data(), 1, pool), pool), Error);
}

}  // namespace
}  // namespace vlm::vision
