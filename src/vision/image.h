// Image decoding to 8-bit RGB, matching what the reference does before its
// processor sees the pixels: PIL's Image.open(...).convert("RGB") (Pillow 9.4,
// the Debian build that also uses libjpeg-turbo and libwebp).
//   - alpha is dropped, never composited; grey and palette are expanded;
//   - palette indices past the stored palette map to grey (i,i,i), as PIL's
//     ramp-initialised palettes do;
//   - 16-bit channels keep the high byte, except 16-bit grey PNG, which PIL
//     opens as mode "I" and converts by clipping to [0, 255];
//   - CMYK JPEG is read with Adobe (inverted) polarity and converted with
//     PIL's formula; EXIF orientation is NOT applied (Gemma3ImageProcessor
//     never transposes; only HF's URL loader load_image() does).
// Formats: PNG, JPEG, WebP (first frame), GIF (first frame; own decoder following
// PIL's, so damaged streams get PIL's verdict), BMP (uncompressed
// 1/4/8/16/24/32-bit and the bitfield layouts PIL reads; RLE is refused).
// Every size is checked against DecodeLimits from the header, before any
// pixel buffer is allocated. Failures throw vlm::Error naming the input.
#pragma once
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace vlm::vision {

struct RgbImage {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;  // height × width × 3, row-major
};

// PIL's Image.MAX_IMAGE_PIXELS (1024·1024·1024 / 4 / 3): PIL warns above it; we refuse.
inline constexpr uint64_t kDefaultMaxPixels = 89'478'485;
inline constexpr uint64_t kDefaultMaxBytes = uint64_t(256) << 20;

struct DecodeLimits {
  uint64_t max_pixels = kDefaultMaxPixels;  // width × height of the decoded canvas
  uint64_t max_bytes = kDefaultMaxBytes;    // size of the encoded input
  std::string_view reason = "decompression bomb guard";  // why max_pixels, in errors
};

// Decoded pixels all images of one request may hold together (3 bytes each: 768 MiB),
// three of PIL's largest images; checked before each image's buffer is allocated.
inline constexpr uint64_t kMaxRequestPixels = 3 * kDefaultMaxPixels;

enum class ImageFormat { Png, Jpeg, WebP, Gif, Bmp };

// Identifies the format from the leading bytes; throws when none matches.
ImageFormat sniff_format(std::span<const uint8_t> bytes, std::string_view what);

// `what` names the input in error messages (a file name, "image 2", ...).
RgbImage decode_image(std::span<const uint8_t> bytes, std::string_view what,
                      const DecodeLimits& limits = {});
RgbImage load_image(const std::filesystem::path& path, const DecodeLimits& limits = {});
// The images of one request, decoded one at a time in order; each gets what is left of
// max_total_pixels, so the request fails on the image that would pass it, unallocated.
std::vector<RgbImage> load_images(std::span<const std::string> paths, uint64_t max_total_pixels = kMaxRequestPixels);

}  // namespace vlm::vision
