#include "vision/image.h"

#include <png.h>
#include <webp/decode.h>
#include <webp/demux.h>

#include <algorithm>
#include <array>
#include <csetjmp>
#include <cstdio>
#include <cstring>

// jpeglib.h needs FILE and size_t declared first.
#include <jerror.h>
#include <jpeglib.h>

#include "core/error.h"
#include "io/file.h"

namespace vlm::vision {

namespace {

using Bytes = std::span<const uint8_t>;

void check_size(uint64_t w, uint64_t h, const DecodeLimits& lim, std::string_view what) {
  if (w == 0 || h == 0) fail("{}: image has zero size ({}x{})", what, w, h);
  if (w > lim.max_pixels / h)  // division: w·h may not fit 64 bits
    fail("{}: image of {}x{} pixels exceeds the limit of {} pixels ({})", what, w, h, lim.max_pixels, lim.reason);
}

RgbImage new_image(uint64_t w, uint64_t h) {
  RgbImage im;
  im.width = int(w);
  im.height = int(h);
  im.rgb.assign(size_t(w * h * 3), 0);
  return im;
}

// A 256-entry palette as PIL holds it: stored entries first, the rest a grey ramp.
using Palette = std::array<uint8_t, 256 * 3>;
Palette ramp_palette() {
  Palette p;
  for (int i = 0; i < 256; ++i) p[3 * i] = p[3 * i + 1] = p[3 * i + 2] = uint8_t(i);
  return p;
}

// ---------------------------------------------------------------- PNG (libpng)

struct PngCtx {
  Bytes in;
  size_t pos = 0;
  std::string what;
  const DecodeLimits* lim = nullptr;
  char err[256] = {};
  png_structp png = nullptr;
  png_infop info = nullptr;
  std::vector<uint8_t> raw;
  std::vector<png_bytep> rows;
  RgbImage out;
  bool size_error = false;
};

void png_read_cb(png_structp png, png_bytep dst, size_t n) {
  auto* c = static_cast<PngCtx*>(png_get_io_ptr(png));
  if (n > c->in.size() - c->pos) png_error(png, "file is truncated");
  std::memcpy(dst, c->in.data() + c->pos, n);
  c->pos += n;
}
void png_error_cb(png_structp png, png_const_charp msg) {
  auto* c = static_cast<PngCtx*>(png_get_error_ptr(png));
  std::snprintf(c->err, sizeof c->err, "%s", msg);
  png_longjmp(png, 1);
}
void png_warning_cb(png_structp, png_const_charp) {}

// All state lives in *c (memory outside this frame), so nothing is lost by the longjmp.
bool png_decode_inner(PngCtx* c) {
  if (setjmp(png_jmpbuf(c->png))) return false;
  png_set_read_fn(c->png, c, png_read_cb);
  png_set_user_limits(c->png, 0x7fffffff, 0x7fffffff);  // our own pixel limit applies below
  png_set_chunk_malloc_max(c->png, 8u << 20);            // bounds text/ICC chunk allocations
  // PIL verifies the CRC of every chunk before the image data and never that of IDAT.
  png_set_crc_action(c->png, PNG_CRC_DEFAULT, PNG_CRC_ERROR_QUIT);
  png_read_info(c->png, c->info);
  png_set_crc_action(c->png, PNG_CRC_QUIET_USE, PNG_CRC_QUIET_USE);
  png_uint_32 w = 0, h = 0;
  int depth = 0, ctype = 0, interlace = 0;
  png_get_IHDR(c->png, c->info, &w, &h, &depth, &ctype, &interlace, nullptr, nullptr);
  if (w == 0 || h == 0 || w > c->lim->max_pixels / h) {
    c->size_error = true;
    c->out.width = int(w);
    c->out.height = int(h);
    return false;
  }
  if (ctype == PNG_COLOR_TYPE_PALETTE && depth < 8) png_set_packing(c->png);
  if (ctype == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(c->png);
  png_set_interlace_handling(c->png);
  png_read_update_info(c->png, c->info);
  const size_t rowbytes = png_get_rowbytes(c->png, c->info);
  c->raw.resize(rowbytes * h);
  c->rows.resize(h);
  for (png_uint_32 y = 0; y < h; ++y) c->rows[y] = c->raw.data() + size_t(y) * rowbytes;
  png_read_image(c->png, c->rows.data());

  Palette pal = ramp_palette();
  if (ctype == PNG_COLOR_TYPE_PALETTE) {
    png_colorp plte = nullptr;
    int n = 0;
    if (png_get_PLTE(c->png, c->info, &plte, &n) != 0)
      for (int i = 0; i < std::min(n, 256); ++i) {
        pal[3 * i] = plte[i].red;
        pal[3 * i + 1] = plte[i].green;
        pal[3 * i + 2] = plte[i].blue;
      }
  }
  c->out = new_image(w, h);
  const int b = depth == 16 ? 2 : 1;  // bytes per sample; 16-bit is big-endian, high byte first
  for (png_uint_32 y = 0; y < h; ++y) {
    const uint8_t* s = c->rows[y];
    uint8_t* d = c->out.rgb.data() + size_t(y) * w * 3;
    for (png_uint_32 x = 0; x < w; ++x, d += 3) {
      switch (ctype) {
        case PNG_COLOR_TYPE_PALETTE: std::memcpy(d, &pal[3 * s[x]], 3); break;
        case PNG_COLOR_TYPE_GRAY:
          if (b == 2)  // PIL mode "I": convert("RGB") clips the 16-bit value to 255
            d[0] = d[1] = d[2] = uint8_t(std::min(255, (s[2 * x] << 8) | s[2 * x + 1]));
          else
            d[0] = d[1] = d[2] = s[x];
          break;
        case PNG_COLOR_TYPE_GRAY_ALPHA: d[0] = d[1] = d[2] = s[2 * b * x]; break;
        case PNG_COLOR_TYPE_RGB:
          for (int k = 0; k < 3; ++k) d[k] = s[(3 * x + k) * b];
          break;
        case PNG_COLOR_TYPE_RGB_ALPHA:
          for (int k = 0; k < 3; ++k) d[k] = s[(4 * x + k) * b];
          break;
      }
    }
  }
  return true;
}

RgbImage decode_png(Bytes in, std::string_view what, const DecodeLimits& lim) {
  // libpng allocates and zeroes a chunk's claimed length before reading it (png_read_buffer),
  // and for readers its per-chunk limit is only a warning: a 71-byte file whose tEXt claims
  // 2 GiB would cost 2 GiB. Chunks before the image data are all read by png_read_info, so
  // one claiming more bytes than the file holds ends in "file is truncated" anyway; say so
  // before the allocation. (Chunks after the first IDAT are never read here.)
  for (size_t pos = 8; pos + 8 <= in.size();) {
    const uint32_t len = uint32_t(in[pos]) << 24 | uint32_t(in[pos + 1]) << 16 | uint32_t(in[pos + 2]) << 8 | in[pos + 3];
    if (std::memcmp(in.data() + pos + 4, "IDAT", 4) == 0) break;
    if (len > in.size() - pos - 8) fail("{}: corrupt PNG: file is truncated", what);
    pos += 8 + size_t(len) + 4;
  }
  PngCtx c;
  c.in = in;
  c.lim = &lim;
  c.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &c, png_error_cb, png_warning_cb);
  if (!c.png) fail("{}: cannot create PNG decoder", what);
  c.info = png_create_info_struct(c.png);
  if (!c.info) {
    png_destroy_read_struct(&c.png, nullptr, nullptr);
    fail("{}: cannot create PNG decoder", what);
  }
  const bool ok = png_decode_inner(&c);
  png_destroy_read_struct(&c.png, &c.info, nullptr);
  if (c.size_error) check_size(uint32_t(c.out.width), uint32_t(c.out.height), lim, what);
  if (!ok) fail("{}: corrupt PNG: {}", what, c.err);
  return std::move(c.out);
}

// ---------------------------------------------------------- JPEG (libjpeg-turbo)

struct JpegErr {
  jpeg_error_mgr mgr;
  jmp_buf jb;
  char msg[JMSG_LENGTH_MAX] = {};
};

void jpeg_error_exit_cb(j_common_ptr ci) {
  auto* e = reinterpret_cast<JpegErr*>(ci->err);
  ci->err->format_message(ci, e->msg);
  std::longjmp(e->jb, 1);
}
// Warnings (corrupt entropy data and the like) are ignored, as PIL ignores them.
void jpeg_emit_cb(j_common_ptr, int) {}

// The whole input is one buffer: asking for more means the file is truncated
// (PIL: "image file is truncated"), except after the last scanline, where PIL
// accepts a missing end marker; there we supply one.
struct JpegSource {
  jpeg_source_mgr pub;
  bool finishing = false;
};
constexpr JOCTET kJpegEoi[2] = {0xFF, JPEG_EOI};
void jpeg_src_init(j_decompress_ptr) {}
boolean jpeg_src_fill(j_decompress_ptr ci) {
  if (!reinterpret_cast<JpegSource*>(ci->src)->finishing) ERREXIT(ci, JERR_INPUT_EOF);
  ci->src->next_input_byte = kJpegEoi;
  ci->src->bytes_in_buffer = 2;
  return TRUE;
}
void jpeg_src_skip(j_decompress_ptr ci, long n) {
  if (n <= 0) return;
  if (size_t(n) > ci->src->bytes_in_buffer) {  // skipping past the end: as running out of data
    ci->src->bytes_in_buffer = 0;
    jpeg_src_fill(ci);
    return;
  }
  ci->src->next_input_byte += n;
  ci->src->bytes_in_buffer -= size_t(n);
}
void jpeg_src_term(j_decompress_ptr) {}

// Pathological progressive files can hold thousands of scans, each a full pass
// over the coefficients; libjpeg-turbo's own tools cap them the same way.
constexpr int kMaxJpegScans = 500;
void jpeg_progress_cb(j_common_ptr ci) {
  auto* d = reinterpret_cast<j_decompress_ptr>(ci);
  if (d->is_decompressor && d->progressive_mode && d->input_scan_number > kMaxJpegScans) {
    auto* e = reinterpret_cast<JpegErr*>(ci->err);
    std::snprintf(e->msg, sizeof e->msg, "more than %d progressive scans", kMaxJpegScans);
    std::longjmp(e->jb, 1);
  }
}

struct JpegCtx {
  jpeg_decompress_struct ci;
  JpegErr err;
  JpegSource src;
  jpeg_progress_mgr progress;
  std::vector<uint8_t> row;
  RgbImage out;
  bool size_error = false;
};

bool jpeg_decode_inner(JpegCtx* c, Bytes in, const DecodeLimits* lim) {
  if (setjmp(c->err.jb)) return false;
  jpeg_create_decompress(&c->ci);
  jpeg_source_mgr& src = c->src.pub;
  src.init_source = jpeg_src_init;
  src.fill_input_buffer = jpeg_src_fill;
  src.skip_input_data = jpeg_src_skip;
  src.resync_to_restart = jpeg_resync_to_restart;
  src.term_source = jpeg_src_term;
  src.next_input_byte = in.data();
  src.bytes_in_buffer = in.size();
  c->ci.src = &src;
  c->progress.progress_monitor = jpeg_progress_cb;
  c->ci.progress = &c->progress;
  jpeg_read_header(&c->ci, TRUE);
  const uint64_t w = c->ci.image_width, h = c->ci.image_height;
  if (w == 0 || h == 0 || w > lim->max_pixels / h) {
    c->out.width = int(w);
    c->out.height = int(h);
    c->size_error = true;
    return false;
  }
  // PIL: 1 component → "L", 3 → "RGB", 4 → "CMYK" read as "CMYK;I" (Adobe polarity).
  const int nc = c->ci.num_components;
  if (nc == 1) c->ci.out_color_space = JCS_GRAYSCALE;
  else if (nc == 3) c->ci.out_color_space = JCS_RGB;
  else if (nc == 4) c->ci.out_color_space = JCS_CMYK;
  else {
    std::snprintf(c->err.msg, sizeof c->err.msg, "cannot handle %d-component JPEG", nc);
    return false;
  }
  jpeg_start_decompress(&c->ci);
  const int oc = c->ci.output_components;
  c->row.resize(size_t(w) * size_t(oc));
  c->out = new_image(w, h);
  while (c->ci.output_scanline < c->ci.output_height) {
    uint8_t* d = c->out.rgb.data() + size_t(c->ci.output_scanline) * w * 3;
    JSAMPROW r = c->row.data();
    jpeg_read_scanlines(&c->ci, &r, 1);
    const uint8_t* s = c->row.data();
    for (uint64_t x = 0; x < w; ++x, d += 3) {
      if (oc == 1) {
        d[0] = d[1] = d[2] = s[x];
      } else if (oc == 3) {
        std::memcpy(d, s + 3 * x, 3);
      } else {
        // "CMYK;I" inverts the stored values, then PIL's cmyk2rgb:
        // out = clip(nk − nk·c/255) with PIL's rounding MULDIV255.
        const int nk = 255 - (255 - s[4 * x + 3]);
        for (int k = 0; k < 3; ++k) {
          const int t = (255 - s[4 * x + k]) * nk + 128;
          const int v = nk - (((t >> 8) + t) >> 8);
          d[k] = uint8_t(std::clamp(v, 0, 255));
        }
      }
    }
  }
  // As PIL: markers after the last scan are still read (corrupt ones are errors).
  c->src.finishing = true;
  jpeg_finish_decompress(&c->ci);
  return true;
}

RgbImage decode_jpeg(Bytes in, std::string_view what, const DecodeLimits& lim) {
  auto c = std::make_unique<JpegCtx>();
  std::memset(&c->ci, 0, sizeof c->ci);
  c->ci.err = jpeg_std_error(&c->err.mgr);
  c->err.mgr.error_exit = jpeg_error_exit_cb;
  c->err.mgr.emit_message = jpeg_emit_cb;
  const bool ok = jpeg_decode_inner(c.get(), in, &lim);
  jpeg_destroy_decompress(&c->ci);
  if (c->size_error) check_size(uint32_t(c->out.width), uint32_t(c->out.height), lim, what);
  if (!ok) fail("{}: corrupt JPEG: {}", what, c->err.msg);
  return std::move(c->out);
}

// ------------------------------------------------------------ WebP (libwebp)

// PIL (with WebP animation support, as Debian builds it) decodes every WebP
// through WebPAnimDecoder with default options (RGBA) and shows the first frame.
RgbImage decode_webp(Bytes in, std::string_view what, const DecodeLimits& lim) {
  WebPBitstreamFeatures feat;
  if (WebPGetFeatures(in.data(), in.size(), &feat) != VP8_STATUS_OK)
    fail("{}: corrupt WebP: bad header", what);
  check_size(uint32_t(feat.width), uint32_t(feat.height), lim, what);
  WebPData data{in.data(), in.size()};
  WebPAnimDecoder* dec = WebPAnimDecoderNew(&data, nullptr);
  if (!dec) fail("{}: corrupt WebP: cannot parse the container", what);
  WebPAnimInfo info;
  uint8_t* buf = nullptr;
  int ts = 0;
  if (!WebPAnimDecoderGetInfo(dec, &info) || uint64_t(info.canvas_width) * info.canvas_height == 0 ||
      uint64_t(info.canvas_width) * info.canvas_height > lim.max_pixels ||
      !WebPAnimDecoderGetNext(dec, &buf, &ts)) {
    WebPAnimDecoderDelete(dec);
    fail("{}: corrupt WebP: cannot decode the first frame", what);
  }
  RgbImage im = new_image(info.canvas_width, info.canvas_height);
  const size_t n = size_t(info.canvas_width) * info.canvas_height;
  for (size_t i = 0; i < n; ++i) std::memcpy(&im.rgb[3 * i], buf + 4 * i, 3);
  WebPAnimDecoderDelete(dec);
  return im;
}

// ------------------------------------------------------------------ GIF (own)
//
// PIL 9.4 reads GIF with its own parser and LZW decoder, and its verdicts on damaged
// streams are part of what we match: so this follows GifImagePlugin.py / GifDecode.c.
// Parser: extension blocks are skipped (a graphic control block with the transparency
// flag sets the transparent index), stray bytes between blocks are ignored, the first
// image descriptor is the frame. Canvas: the logical screen grown to the frame's extent,
// filled with the transparent index when there is one (else index 0). Colours: the local
// table, else the global one, else grey; indices past the table map to the grey ramp.
// Decoder: sub-block lengths are read as they come (a zero length is not an end), an end
// code before the last pixel or running out of data is "truncated", a code past the next
// free table slot is "broken"; decoding stops at the last pixel.

struct GifReader {
  Bytes in;
  size_t pos = 0;
  std::string_view what;
  uint8_t byte() {
    if (pos >= in.size()) fail("{}: corrupt GIF: file is truncated", what);
    return in[pos++];
  }
  uint16_t u16() {
    const uint8_t lo = byte();
    return uint16_t(lo | byte() << 8);
  }
  // One data sub-block (PIL's data()): empty span for a zero length.
  Bytes block() {
    const size_t n = byte();
    if (n > in.size() - pos) fail("{}: corrupt GIF: file is truncated", what);
    Bytes b = in.subspan(pos, n);
    pos += n;
    return b;
  }
};

void gif_broken(std::string_view what) { fail("{}: corrupt GIF: broken LZW data stream", what); }

// Decodes LZW codes (min code size `bits`) from r into the frame rect of idx.
void gif_lzw(GifReader& r, int bits, bool interlace, std::vector<uint8_t>& idx, uint64_t cw, uint64_t left,
             uint64_t top, uint64_t fw, uint64_t fh) {
  constexpr int kTable = 4096, kMaxBits = 12;
  if (bits < 0 || bits > kMaxBits) fail("{}: corrupt GIF: LZW code size {}", r.what, bits);
  const int clear = 1 << bits, end = clear + 1;
  std::vector<uint8_t> buffer(kTable), data(kTable);
  std::vector<uint16_t> link(kTable);
  int state = 1, next = 0, codesize = 0, codemask = 0, bufferindex = kTable, lastcode = 0;
  uint8_t lastdata = 0;
  uint32_t bitbuffer = 0;
  int bitcount = 0;
  size_t blocksize = 0;
  int step = interlace ? 8 : 1, pass = interlace ? 1 : 0;
  uint64_t x = 0, y = 0;
  auto newline = [&]() -> bool {  // false when the last row is done
    x = 0;
    y += uint64_t(step);
    while (y >= fh) {
      if (pass == 1) y = 4, pass = 2;
      else if (pass == 2) step = 4, y = 2, pass = 3;
      else if (pass == 3) step = 2, y = 1, pass = 0;
      else return false;
    }
    return true;
  };
  for (;;) {
    if (state == 1) {
      next = clear + 2;
      codesize = bits + 1;
      codemask = (1 << codesize) - 1;
      bufferindex = kTable;
      state = 2;
    }
    const uint8_t* p;
    int n;
    if (bufferindex < kTable) {
      n = kTable - bufferindex;
      p = &buffer[size_t(bufferindex)];
      bufferindex = kTable;
    } else {
      while (bitcount < codesize) {
        if (blocksize > 0) {
          bitbuffer |= uint32_t(r.byte()) << bitcount;
          bitcount += 8;
          --blocksize;
        } else {
          blocksize = r.byte();
          if (blocksize > r.in.size() - r.pos) fail("{}: corrupt GIF: file is truncated", r.what);
        }
      }
      int c = int(bitbuffer & uint32_t(codemask));
      bitbuffer >>= codesize;
      bitcount -= codesize;
      if (c == clear) {
        if (state != 2) state = 1;
        continue;
      }
      if (c == end) fail("{}: corrupt GIF: image data ends early (file is truncated)", r.what);
      n = 1;
      p = &lastdata;
      if (state == 2) {
        if (c > clear) gif_broken(r.what);
        lastdata = uint8_t(c);
        lastcode = c;
        state = 3;
      } else {
        const int thiscode = c;
        if (c > next) gif_broken(r.what);
        if (c == next) {
          if (bufferindex <= 0) gif_broken(r.what);
          buffer[size_t(--bufferindex)] = lastdata;
          c = lastcode;
        }
        while (c >= clear) {
          if (bufferindex <= 0 || c >= kTable) gif_broken(r.what);
          buffer[size_t(--bufferindex)] = data[size_t(c)];
          c = link[size_t(c)];
        }
        lastdata = uint8_t(c);
        if (next < kTable) {
          data[size_t(next)] = uint8_t(c);
          link[size_t(next)] = uint16_t(lastcode);
          if (next == codemask && codesize < kMaxBits) {
            ++codesize;
            codemask = (1 << codesize) - 1;
          }
          ++next;
        }
        lastcode = thiscode;
      }
    }
    for (int k = 0; k < n; ++k) {
      idx[size_t((top + y) * cw + left + x)] = p[k];
      if (++x >= fw && !newline()) return;
    }
  }
}

RgbImage decode_gif(Bytes in, std::string_view what, const DecodeLimits& lim) {
  GifReader r{in, 0, what};
  r.pos = 6;  // signature, checked by sniff_format
  uint64_t cw = r.u16(), ch = r.u16();
  const uint8_t flags = r.byte();
  r.byte();  // background index: PIL does not use it for the first frame
  r.byte();  // aspect ratio
  Palette pal = ramp_palette();
  auto read_table = [&](int entries) {
    if (size_t(entries) * 3 > in.size() - r.pos) fail("{}: corrupt GIF: file is truncated", what);
    for (int i = 0; i < entries; ++i)
      for (int k = 0; k < 3; ++k) pal[size_t(3 * i + k)] = in[r.pos++];
  };
  if (flags & 0x80) read_table(2 << (flags & 7));
  int transparent = -1;
  for (;;) {
    if (r.pos >= in.size() || in[r.pos] == ';') fail("{}: GIF holds no image", what);
    const uint8_t b = r.byte();
    if (b == '!') {
      const uint8_t label = r.byte();
      Bytes blk = r.block();
      // As PIL: a control block without the transparency flag keeps an earlier index.
      if (label == 0xF9) {
        if (blk.size() < 4) fail("{}: corrupt GIF: short graphic control block", what);
        if (blk[0] & 1) transparent = blk[3];
      }
      while (!blk.empty()) blk = r.block();
      continue;
    }
    if (b != ',') continue;  // PIL skips stray bytes between blocks
    const uint64_t left = r.u16(), top = r.u16(), fw = r.u16(), fh = r.u16();
    const uint8_t iflags = r.byte();
    cw = std::max(cw, left + fw);
    ch = std::max(ch, top + fh);
    check_size(cw, ch, lim, what);
    if (fw == 0 || fh == 0) fail("{}: corrupt GIF: empty frame {}x{}", what, fw, fh);
    if (iflags & 0x80) {
      pal = ramp_palette();  // the local table replaces the global one
      read_table(2 << (iflags & 7));
    }
    const int bits = r.byte();
    std::vector<uint8_t> idx(size_t(cw * ch), uint8_t(transparent >= 0 ? transparent : 0));
    gif_lzw(r, bits, (iflags & 0x40) != 0, idx, cw, left, top, fw, fh);
    RgbImage im = new_image(cw, ch);
    for (size_t i = 0; i < idx.size(); ++i) std::memcpy(&im.rgb[3 * i], &pal[3 * size_t(idx[i])], 3);
    return im;
  }
}

// ------------------------------------------------------------------ BMP (own)

uint32_t le32(Bytes b, size_t o) {
  return uint32_t(b[o]) | uint32_t(b[o + 1]) << 8 | uint32_t(b[o + 2]) << 16 | uint32_t(b[o + 3]) << 24;
}
uint16_t le16(Bytes b, size_t o) { return uint16_t(b[o] | b[o + 1] << 8); }

// Follows PIL 9.4's BmpImagePlugin: header sizes 12/40/64/108/124, bottom-up
// unless the height's top byte is 0xFF, rows padded to 4 bytes.
RgbImage decode_bmp(Bytes in, std::string_view what, const DecodeLimits& lim) {
  auto need = [&](size_t end) {
    if (end > in.size()) fail("{}: corrupt BMP: file is truncated", what);
  };
  need(18);
  const uint32_t offset = le32(in, 10);
  const uint32_t hsize = le32(in, 14);
  uint64_t w = 0, h = 0;
  uint32_t bits = 0, comp = 0, colors = 0, pal_stride = 4;
  bool top_down = false;
  uint32_t masks[4] = {0, 0, 0, 0};
  size_t after_header = 14 + size_t(hsize);
  if (hsize == 12) {
    need(26);
    w = le16(in, 18);
    h = le16(in, 20);
    bits = le16(in, 24);
    pal_stride = 3;
  } else if (hsize == 40 || hsize == 64 || hsize == 108 || hsize == 124) {
    need(after_header);
    w = le32(in, 18);
    const uint32_t rawh = le32(in, 22);
    top_down = in[25] == 0xFF;
    h = top_down ? (uint64_t(1) << 32) - rawh : rawh;
    bits = le16(in, 28);
    comp = le32(in, 30);
    colors = le32(in, 46);
    if (comp == 3) {
      if (hsize >= 56) {
        for (int i = 0; i < 4; ++i) masks[i] = le32(in, 54 + 4 * size_t(i));
      } else {  // masks follow a 40-byte header
        need(after_header + 12);
        for (int i = 0; i < 3; ++i) masks[i] = le32(in, after_header + 4 * size_t(i));
        after_header += 12;
      }
    }
  } else {
    fail("{}: unsupported BMP header size {}", what, hsize);
  }
  if (bits != 1 && bits != 4 && bits != 8 && bits != 16 && bits != 24 && bits != 32)
    fail("{}: unsupported BMP pixel depth {}", what, bits);
  if (comp == 1 || comp == 2) fail("{}: RLE-compressed BMP is not supported", what);
  // Channel extraction for direct-colour pixels: byte offsets, or 16-bit 5/6-bit fields.
  enum class Px { Pal, Bgr, X16_555, X16_565 } px = Px::Pal;
  int roff[3] = {2, 1, 0};  // byte offsets of R, G, B within a pixel
  if (bits <= 8) {
    px = Px::Pal;
  } else if (comp == 0) {
    px = bits == 16 ? Px::X16_555 : Px::Bgr;
  } else if (comp == 3) {
    const uint32_t r = masks[0], g = masks[1], b = masks[2], a = masks[3];
    if (bits == 32 && ((r == 0xFF0000 && g == 0xFF00 && b == 0xFF && (a == 0 || a == 0xFF000000)) ||
                       (r == 0 && g == 0 && b == 0 && a == 0))) {
      px = Px::Bgr;  // BGRX / BGRA
    } else if (bits == 32 && r == 0xFF000000 && g == 0xFF0000 && b == 0xFF00 && (a == 0 || a == 0xFF)) {
      px = Px::Bgr;  // XBGR / ABGR
      roff[0] = 3, roff[1] = 2, roff[2] = 1;
    } else if (bits == 32 && r == 0xFF && g == 0xFF00 && b == 0xFF0000 && a == 0xFF000000) {
      px = Px::Bgr;  // RGBA
      roff[0] = 0, roff[1] = 1, roff[2] = 2;
    } else if (bits == 24 && r == 0xFF0000 && g == 0xFF00 && b == 0xFF) {
      px = Px::Bgr;
    } else if (bits == 16 && r == 0xF800 && g == 0x7E0 && b == 0x1F) {
      px = Px::X16_565;
    } else if (bits == 16 && r == 0x7C00 && g == 0x3E0 && b == 0x1F) {
      px = Px::X16_555;
    } else {
      fail("{}: unsupported BMP bitfields layout", what);
    }
  } else {
    fail("{}: unsupported BMP compression {}", what, comp);
  }
  check_size(w, h, lim, what);

  Palette pal = ramp_palette();
  size_t data_off = offset;
  if (px == Px::Pal) {
    const uint64_t n = colors ? colors : (uint64_t(1) << bits);
    if (n > 65536) fail("{}: unsupported BMP palette size {}", what, n);
    const size_t pal_off = after_header;
    need(pal_off + size_t(n) * pal_stride);
    if (offset == 14 + hsize) data_off += size_t(4 * n);  // PIL's fix for a zero data offset field
    // PIL reads a grey-identity palette as mode "1"/"L"; a lookup gives the same pixels.
    for (uint64_t i = 0; i < std::min<uint64_t>(n, 256); ++i) {
      const uint8_t* e = &in[pal_off + size_t(i) * pal_stride];
      pal[3 * i] = e[2], pal[3 * i + 1] = e[1], pal[3 * i + 2] = e[0];
    }
  }
  const uint64_t stride = ((w * bits + 31) >> 3) & ~uint64_t(3);
  // The last stored row needs no padding bytes (PIL reads only what it unpacks).
  const uint64_t need_bytes = stride * (h - 1) + ((w * bits + 7) >> 3);
  if (data_off > in.size() || need_bytes > in.size() - data_off)
    fail("{}: corrupt BMP: file is truncated", what);
  RgbImage im = new_image(w, h);
  const uint32_t bpp = bits / 8;
  for (uint64_t y = 0; y < h; ++y) {
    const uint8_t* s = in.data() + data_off + size_t(stride * y);
    uint8_t* d = im.rgb.data() + size_t((top_down ? y : h - 1 - y) * w * 3);
    for (uint64_t x = 0; x < w; ++x, d += 3) {
      switch (px) {
        case Px::Pal: {
          const unsigned per = 8 / bits;
          const unsigned byte = s[x / per];
          const unsigned shift = 8 - bits * (unsigned(x % per) + 1);
          const unsigned i = (byte >> shift) & ((1u << bits) - 1);
          std::memcpy(d, &pal[3 * i], 3);
          break;
        }
        case Px::Bgr:
          for (int k = 0; k < 3; ++k) d[k] = s[x * bpp + size_t(roff[k])];
          break;
        case Px::X16_555:
        case Px::X16_565: {
          // PIL's "BGR;15"/"BGR;16" unpackers: field · 255 / max (integer division).
          const unsigned v = le16(Bytes(s, size_t(stride)), size_t(2 * x));
          if (px == Px::X16_555) {
            d[0] = uint8_t(((v >> 10) & 31) * 255 / 31);
            d[1] = uint8_t(((v >> 5) & 31) * 255 / 31);
          } else {
            d[0] = uint8_t(((v >> 11) & 31) * 255 / 31);
            d[1] = uint8_t(((v >> 5) & 63) * 255 / 63);
          }
          d[2] = uint8_t((v & 31) * 255 / 31);
          break;
        }
      }
    }
  }
  return im;
}

}  // namespace

ImageFormat sniff_format(Bytes b, std::string_view what) {
  auto starts = [&](std::string_view magic, size_t at = 0) {
    return b.size() >= at + magic.size() && std::memcmp(b.data() + at, magic.data(), magic.size()) == 0;
  };
  if (b.empty()) fail("{}: empty input, not an image", what);
  if (starts("\x89PNG\r\n\x1a\n")) return ImageFormat::Png;
  if (starts("\xFF\xD8\xFF")) return ImageFormat::Jpeg;
  if (starts("RIFF") && starts("WEBP", 8)) return ImageFormat::WebP;
  if (starts("GIF87a") || starts("GIF89a")) return ImageFormat::Gif;
  if (starts("BM")) return ImageFormat::Bmp;
  fail("{}: not a supported image (PNG, JPEG, WebP, GIF or BMP expected)", what);
}

RgbImage decode_image(Bytes bytes, std::string_view what, const DecodeLimits& limits) {
  if (bytes.size() > limits.max_bytes)
    fail("{}: {} bytes exceeds the input limit of {} bytes", what, bytes.size(), limits.max_bytes);
  switch (sniff_format(bytes, what)) {
    case ImageFormat::Png: return decode_png(bytes, what, limits);
    case ImageFormat::Jpeg: return decode_jpeg(bytes, what, limits);
    case ImageFormat::WebP: return decode_webp(bytes, what, limits);
    case ImageFormat::Gif: return decode_gif(bytes, what, limits);
    case ImageFormat::Bmp: return decode_bmp(bytes, what, limits);
  }
  fail("{}: unknown image format", what);
}

RgbImage load_image(const std::filesystem::path& path, const DecodeLimits& limits) {
  const InputFile f(path);
  if (f.size() > limits.max_bytes)
    fail("{}: {} bytes exceeds the input limit of {} bytes", f.where(), f.size(), limits.max_bytes);
  std::vector<uint8_t> buf(size_t(f.size()), 0);
  f.read_at(buf.data(), buf.size(), 0);
  return decode_image(buf, f.where(), limits);
}

std::vector<RgbImage> load_images(std::span<const std::string> paths, uint64_t max_total_pixels) {
  std::vector<RgbImage> out;
  uint64_t used = 0;
  for (const std::string& p : paths) {
    DecodeLimits lim;
    std::string reason;
    if (max_total_pixels - used < lim.max_pixels) {
      reason = fmt::format("what is left of the limit of {} pixels over all {} images of the request",
                           max_total_pixels, paths.size());
      lim.max_pixels = max_total_pixels - used;
      lim.reason = reason;
    }
    out.push_back(load_image(p, lim));
    used += uint64_t(out.back().width) * uint64_t(out.back().height);
  }
  return out;
}

}  // namespace vlm::vision
