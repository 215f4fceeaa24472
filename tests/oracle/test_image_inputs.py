"""Bad image inputs through `vlm dump --image`: a one-line error naming the file and exit status 1,
never a crash, never an unbounded allocation; and, for damaged files, the same verdict as PIL.

Truncated and corrupted variants of a file of each format are decoded by both the engine and PIL
(the reference's decoder): when PIL accepts one, the engine must accept it with identical pixel
values; when PIL refuses it, the engine must refuse it. GIF gets an extra sweep of randomly
corrupted files, since its decoder (ours, after PIL's) decides alone what a broken stream is.
"""
import os
import resource
import struct
import subprocess
import tempfile
import unittest
import zlib

import numpy as np

import images
import preprocess

BIN = os.environ.get("VLM_BIN", "vlm")
FIX = os.environ.get("VLM_FIXTURES", "fixtures")
MODEL = os.path.join(FIX, "tiny-f32")
MEM_LIMIT = 2 << 30  # address space for the bomb runs: far below what any bomb would need


def run(path, out, limit_memory=False):
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (MEM_LIMIT, MEM_LIMIT))
    # An ASan build cannot map its shadow memory under the cap; there ASan's own allocator
    # aborts on a bomb-sized allocation instead, which fails the test just the same.
    sanitized = False
    if os.path.isfile(BIN):
        with open(BIN, "rb") as f:
            sanitized = b"__asan_init" in f.read()
    cmd = [BIN, "dump", "--model", MODEL, "--prompt", "x", "--steps", "0", "--image", path, "--out", out]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                          preexec_fn=cap if limit_memory and not sanitized else None)


def png_header_only(w, h):
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    idat = zlib.compress(b"\x00" * 1000)
    return (b"\x89PNG\r\n\x1a\n" + chunk + struct.pack(">I", len(idat)) + b"IDAT" + idat
            + struct.pack(">I", zlib.crc32(b"IDAT" + idat)))


def jpeg_header_only(w, h):
    """SOI, a quantisation table, SOF0 for w x h, one-code Huffman tables and SOS, then a few
    bytes of scan data: everything a decoder reads before it allocates the image."""
    dqt = b"\xff\xdb" + struct.pack(">H", 67) + b"\x00" + bytes(range(1, 65))
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, h, w, 3) + b"\x01\x22\x00\x02\x11\x00\x03\x11\x00"
    table = b"\x01" + b"\x00" * 15 + b"\x00"  # one code of length 1 for symbol 0
    dht = b"\xff\xc4" + struct.pack(">H", 2 + 2 * 18) + b"\x00" + table + b"\x10" + table
    sos = b"\xff\xda" + struct.pack(">HB", 12, 3) + b"\x01\x00\x02\x00\x03\x00" + b"\x00\x3f\x00"
    return b"\xff\xd8" + dqt + sof + dht + sos + b"\x00" * 64


def gif_header_only(w, h):
    return b"GIF89a" + struct.pack("<HHBBB", w, h, 0, 0, 0) + b",\x00\x00\x00\x00" + struct.pack("<HH", w, h) + b"\x00\x08"


def bmp_header_only(w, h):
    info = struct.pack("<IiiHHIIiiII", 40, w, h, 1, 24, 0, 0, 0, 0, 0, 0)
    return b"BM" + struct.pack("<IHHI", 54, 0, 0, 54) + info


def webp_header_only(w, h):
    vp8x = b"VP8X" + struct.pack("<I", 10) + b"\x00\x00\x00\x00" + (w - 1).to_bytes(3, "little") + (h - 1).to_bytes(3, "little")
    return b"RIFF" + struct.pack("<I", 4 + len(vp8x)) + b"WEBP" + vp8x


class BadImageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.images = images.make_all(os.path.join(cls.tmp.name, "img"))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def write(self, name, data):
        p = os.path.join(self.tmp.name, name)
        with open(p, "wb") as f:
            f.write(data)
        return p

    def expect_error(self, path, *words, limit_memory=False):
        r = run(path, os.path.join(self.tmp.name, "out"), limit_memory)
        self.assertEqual(r.returncode, 1, f"{path}: rc {r.returncode}, stderr {r.stderr!r}")
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertTrue(lines[0].startswith("vlm dump: error: "), lines[0])
        self.assertIn(path, lines[0])
        for w in words:
            self.assertIn(w, lines[0])
        return lines[0]

    def test_empty_and_not_an_image(self):
        self.expect_error(self.write("empty.png", b""), "empty")
        self.expect_error(self.write("text.jpg", b"hello, this is not an image\n" * 10), "not a supported image")
        self.expect_error(self.write("magic_only.png", b"\x89PNG\r\n\x1a\n"), "PNG")
        self.expect_error(os.path.join(self.tmp.name, "does-not-exist.png"), "cannot read")

    def test_decompression_bombs_refused_from_the_header(self):
        # Each header claims ~10^10 pixels (tens of GB decoded); the run is capped at 2 GiB of
        # address space, and the error must come from the pixel limit, not from a failed allocation.
        bombs = {"bomb.png": png_header_only(100000, 100000), "bomb.jpg": jpeg_header_only(65000, 65000),
                 "bomb.gif": gif_header_only(65535, 65535), "bomb.bmp": bmp_header_only(100000, 100000),
                 "bomb.webp": webp_header_only(16384, 16384)}
        for name, data in bombs.items():
            with self.subTest(name):
                self.expect_error(self.write(name, data), "exceeds the limit of 89478485 pixels",
                                  limit_memory=True)

    def test_zero_sized(self):
        for name, data in {"zero.gif": gif_header_only(0, 5), "zero.bmp": bmp_header_only(0, 7),
                           "zero.jpg": jpeg_header_only(0, 8)}.items():
            with self.subTest(name):
                self.expect_error(self.write(name, data))
        self.expect_error(self.write("zero.png", png_header_only(0, 4)), "PNG")

    def test_one_by_one(self):
        # Valid 1x1 images in every format decode and equal the oracle's pixels.
        for name in ("png_rgb_1x1.png", "jpeg_base_1x1.jpg", "webp_lossy_1x1.webp", "bmp_rgb_1x1.bmp", "gif_1x1.gif"):
            with self.subTest(name):
                out = os.path.join(self.tmp.name, "o1")
                r = run(self.images[name], out)
                self.assertEqual(r.returncode, 0, r.stderr)
                ref, _ = preprocess.pixel_values([self.images[name]], 64)
                np.testing.assert_array_equal(np.load(os.path.join(out, "pixel_values.npy")), ref)

    def test_png_checksums_as_pil(self):
        # PIL checks the CRC of every chunk before the image data and skips IDAT's.
        rows = [bytes(range(y * 15, y * 15 + 15)) for y in range(4)]
        good = images.png_bytes(5, 4, 8, 2, rows)
        i = good.index(b"IDAT")
        end = i + 4 + struct.unpack(">I", good[i - 4:i])[0]
        bad_idat = good[:end] + bytes([good[end] ^ 1]) + good[end + 1:]
        text = b"tEXtk\x00v"
        bad_text = (good[:i - 4] + struct.pack(">I", 3) + text
                    + struct.pack(">I", zlib.crc32(text) ^ 1) + good[i - 4:])
        path = self.write("bad_idat_crc.png", bad_idat)
        out = os.path.join(self.tmp.name, "crc")
        r = run(path, out)
        self.assertEqual(r.returncode, 0, r.stderr)
        ref, _ = preprocess.pixel_values([path], 64)
        np.testing.assert_array_equal(np.load(os.path.join(out, "pixel_values.npy")), ref)
        path = self.write("bad_text_crc.png", bad_text)
        with self.assertRaises(Exception):
            preprocess.pixel_values([path], 64)
        self.expect_error(path, "CRC")

    def test_truncated_and_corrupted_agree_with_pil(self):
        rng = np.random.default_rng(0)
        sources = ["png_rgb_37x91.png", "png_pal.png", "png_rgb16.png", "jpeg_base_37x91.jpg",
                   "jpeg_progressive.jpg", "jpeg_cmyk.jpg", "webp_lossy_37x91.webp", "webp_lossless_alpha.webp",
                   "bmp_rgb_37x91.bmp", "bmp_4bit.bmp", "bmp_565.bmp", "gif_37x91.gif", "gif_interlaced.gif"]
        checked = 0
        for s in sources:
            with open(self.images[s], "rb") as f:
                data = f.read()
            variants = [(f"trunc{f}", data[:max(1, len(data) * f // 100)]) for f in (2, 10, 30, 60, 90)]
            variants += [("trunc-1", data[:-1]), ("trunc-10", data[:-10])]
            for k in range(40 if s.startswith("gif") else 4):
                b = bytearray(data)
                for _ in range(3):
                    b[rng.integers(len(b) // 4, len(b))] = rng.integers(0, 256)
                variants.append((f"corrupt{k}", bytes(b)))
            for tag, blob in variants:
                with self.subTest(image=s, variant=tag):
                    path = self.write(f"{tag}_{s}", blob)
                    out = os.path.join(self.tmp.name, "ov")
                    r = run(path, out)
                    self.assertIn(r.returncode, (0, 1), f"crash: rc {r.returncode} {r.stderr!r}")
                    try:
                        ref, _ = preprocess.pixel_values([path], 64)
                    except Exception:  # PIL refuses it
                        ref = None
                    if r.returncode == 1:
                        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                        self.assertIn(path, r.stderr)
                    if ref is None:
                        self.assertEqual(r.returncode, 1, "PIL refuses this file; the engine accepted it")
                    else:
                        self.assertEqual(r.returncode, 0, f"PIL accepts this file; engine: {r.stderr.strip()}")
                        np.testing.assert_array_equal(np.load(os.path.join(out, "pixel_values.npy")), ref)
                    checked += 1
        self.assertGreater(checked, 100)


if __name__ == "__main__":
    unittest.main()
