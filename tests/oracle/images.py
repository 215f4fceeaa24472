"""Test images in every format the engine decodes, written with PIL or by hand (for the variants
PIL cannot write: 16-bit RGB PNG, 2-bit grey, palettes shorter than the indices used, 16-bit and
bitfield BMPs, top-down BMP, GIF frames offset from or larger than the logical screen).

    paths = make_all(folder)   # {name: path}, grouped by format via the name prefix
"""
import io
import os
import struct
import zlib

import numpy as np
from PIL import Image

SIZES = [(1, 1), (2, 3), (1, 300), (300, 1), (37, 91), (64, 64), (7, 5), (129, 64), (3000, 2000)]


def content(w, h, seed=0):
    """uint8 [h, w, 3]: a smooth gradient plus noise, so both resize paths and codecs are exercised."""
    rng = np.random.default_rng(seed + 7919 * w + h)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255.0 / max(w - 1, 1), y * 255.0 / max(h - 1, 1),
                     (x + y) * 127.0 / max(w + h - 2, 1)], -1)
    return np.clip(base + rng.normal(0, 40, (h, w, 3)), 0, 255).astype(np.uint8)


# ---------------------------------------------------------------- hand-written PNG

def _chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_bytes(w, h, depth, ctype, rows, plte=None):
    """A PNG from raw packed scanlines (filter 0 each); rows: list of bytes."""
    out = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, 0))
    if plte is not None:
        out += _chunk(b"PLTE", plte)
    out += _chunk(b"IDAT", zlib.compress(b"".join(b"\x00" + r for r in rows)))
    return out + _chunk(b"IEND", b"")


def png16(w, h, channels, seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 65536, (h, w, channels), dtype=np.uint16)
    if channels == 1:  # mostly small values: PIL clips 16-bit grey to 255, keep both sides covered
        a = (a % 600).astype(np.uint16)
    ctype = {1: 0, 2: 4, 3: 2, 4: 6}[channels]
    return png_bytes(w, h, 16, ctype, [a[y].astype(">u2").tobytes() for y in range(h)])


def png_gray2(w, h, seed):
    v = np.random.default_rng(seed).integers(0, 4, (h, w))
    rows = []
    for y in range(h):
        bits = np.zeros((w + 3) // 4 * 4, np.uint8)
        bits[:w] = v[y]
        q = bits.reshape(-1, 4)
        rows.append(bytes((q[:, 0] << 6 | q[:, 1] << 4 | q[:, 2] << 2 | q[:, 3]).astype(np.uint8)))
    return png_bytes(w, h, 2, 0, rows)


def png_short_palette(w, h, seed):
    """8-bit palette PNG with 5 entries whose pixels use indices up to 255 (PIL: grey ramp)."""
    idx = np.random.default_rng(seed).integers(0, 256, (h, w), dtype=np.uint8)
    plte = bytes([200, 10, 10, 10, 200, 10, 10, 10, 200, 1, 2, 3, 250, 250, 250])
    return png_bytes(w, h, 8, 3, [idx[y].tobytes() for y in range(h)], plte)


# ---------------------------------------------------------------- hand-written BMP

def bmp_bytes(w, h, bits, pixel_rows, header=40, compression=0, masks=None, palette=b"", top_down=False):
    """A BMP with the given header size; pixel_rows top row first, each already packed."""
    stride = ((w * bits + 31) >> 3) & ~3
    rows = [r + b"\x00" * (stride - len(r)) for r in pixel_rows]
    if not top_down:
        rows = rows[::-1]
    data = b"".join(rows)
    info = struct.pack("<iiHHIIiiII", w, -h if top_down else h, 1, bits, compression, len(data), 2835, 2835,
                       len(palette) // 4, 0)
    extra = b""
    if header > 40:
        m = list(masks or (0, 0, 0, 0)) + [0] * 4
        extra = struct.pack("<IIII", *m[:4]) + b"\x00" * (header - 40 - 16)
    elif masks is not None:
        extra_after = struct.pack("<III", *masks[:3])
        info += extra_after  # masks follow a 40-byte header
    body = struct.pack("<I", header) + info + extra
    off = 14 + len(body) + len(palette)
    return b"BM" + struct.pack("<IHHI", off + len(data), 0, 0, off) + body + palette + data


def bmp16(w, h, seed, layout):
    v = np.random.default_rng(seed).integers(0, 65536, (h, w), dtype=np.uint16)
    rows = [v[y].astype("<u2").tobytes() for y in range(h)]
    if layout == "555":
        return bmp_bytes(w, h, 16, rows)
    return bmp_bytes(w, h, 16, rows, compression=3, masks=(0xF800, 0x7E0, 0x1F))


def bmp4(w, h, seed, top_down=False):
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, 16, (h, w))
    pal = bytes(rng.integers(0, 256, 64, dtype=np.uint8))
    rows = []
    for y in range(h):
        r = list(idx[y]) + [0] * (w % 2)
        rows.append(bytes(r[i] << 4 | r[i + 1] for i in range(0, len(r), 2)))
    return bmp_bytes(w, h, 4, rows, palette=pal, top_down=top_down)


def bmp32_v5(w, h, seed):
    a = np.random.default_rng(seed).integers(0, 256, (h, w, 4), dtype=np.uint8)
    # RGBA byte order in memory: masks R=0xFF, G=0xFF00, B=0xFF0000, A=0xFF000000
    return bmp_bytes(w, h, 32, [a[y].tobytes() for y in range(h)], header=124, compression=3,
                     masks=(0xFF, 0xFF00, 0xFF0000, 0xFF000000))


# ---------------------------------------------------------------- GIF variants

def gif_with_screen(w, h, screen, offset, seed):
    """A PIL-written single-frame GIF, then its logical screen and frame offset rewritten."""
    im = Image.fromarray(content(w, h, seed)).convert("P", palette=Image.ADAPTIVE, colors=64)
    buf = io.BytesIO()
    im.save(buf, "GIF", interlace=False)
    b = bytearray(buf.getvalue())
    b[6:10] = struct.pack("<HH", *screen)
    i = 13 + (3 << ((b[10] & 7) + 1) if b[10] & 0x80 else 0)
    while b[i] == 0x21:  # extension blocks: introducer, label, sub-blocks up to a zero length
        i += 2
        while b[i]:
            i += b[i] + 1
        i += 1
    assert b[i] == 0x2C, "image descriptor expected"
    b[i + 1:i + 5] = struct.pack("<HH", *offset)
    return bytes(b)


def make_all(folder):
    os.makedirs(folder, exist_ok=True)
    out = {}

    def put(name, data=None, im=None, **save):
        path = os.path.join(folder, name)
        if data is not None:
            with open(path, "wb") as f:
                f.write(data)
        else:
            im.save(path, **save)
        out[name] = path

    for (w, h) in SIZES:
        rgb = Image.fromarray(content(w, h))
        tag = f"{w}x{h}"
        put(f"png_rgb_{tag}.png", im=rgb)
        put(f"jpeg_base_{tag}.jpg", im=rgb, quality=90)
        put(f"webp_lossy_{tag}.webp", im=rgb, quality=80)
        put(f"bmp_rgb_{tag}.bmp", im=rgb)
        put(f"gif_{tag}.gif", im=rgb.convert("P", palette=Image.ADAPTIVE, colors=200))
    w, h = 45, 31
    rgb = Image.fromarray(content(w, h, 1))
    alpha = Image.fromarray(np.random.default_rng(2).integers(0, 256, (h, w), dtype=np.uint8))
    rgba = rgb.copy()
    rgba.putalpha(alpha)
    gray = rgb.convert("L")
    pal = rgb.convert("P", palette=Image.ADAPTIVE, colors=50)
    # PNG
    put("png_rgba.png", im=rgba)
    put("png_gray.png", im=gray)
    la = gray.copy()
    la.putalpha(alpha)
    put("png_la.png", im=la)
    put("png_pal.png", im=pal)
    put("png_pal_trns.png", im=pal, transparency=3)
    put("png_pal_4bit.png", im=rgb.convert("P", palette=Image.ADAPTIVE, colors=16), bits=4)
    put("png_1bit.png", im=gray.convert("1"))
    put("png_gray16.png", data=png16(w, h, 1, 3))
    put("png_la16.png", data=png16(w, h, 2, 4))
    put("png_rgb16.png", data=png16(w, h, 3, 5))
    put("png_rgba16.png", data=png16(w, h, 4, 6))
    put("png_gray2.png", data=png_gray2(w, h, 7))
    put("png_short_palette.png", data=png_short_palette(w, h, 8))
    put("png_rgb_trns.png", im=rgb, transparency=(10, 20, 30))
    second = Image.fromarray(content(w, h, 10))
    put("png_apng.png", im=rgb, save_all=True, append_images=[second], duration=100)
    put("png_apng_hidden_default.png", im=rgb, save_all=True, append_images=[second, rgb], duration=100,
        default_image=True)
    # JPEG
    put("jpeg_444.jpg", im=rgb, quality=95, subsampling=0)
    put("jpeg_422.jpg", im=rgb, quality=75, subsampling=1)
    put("jpeg_progressive.jpg", im=rgb, quality=85, progressive=True)
    put("jpeg_progressive_big.jpg", im=Image.fromarray(content(1500, 1000, 9)), quality=85, progressive=True)
    put("jpeg_gray.jpg", im=gray, quality=90)
    put("jpeg_cmyk.jpg", im=rgb.convert("CMYK"), quality=90)
    put("jpeg_exif_rotated.jpg", im=rgb, quality=90, exif=_exif_orientation(6))
    # WebP
    put("webp_lossy_alpha.webp", im=rgba, quality=80)
    put("webp_lossless.webp", im=rgb, lossless=True)
    put("webp_lossless_alpha.webp", im=rgba, lossless=True)
    frames = [rgb, Image.fromarray(content(w, h, 11))]
    put("webp_animated.webp", im=frames[0], save_all=True, append_images=frames[1:], duration=100)
    # BMP
    put("bmp_1bit.bmp", im=gray.convert("1"))
    put("bmp_gray.bmp", im=gray)
    put("bmp_pal.bmp", im=pal)
    put("bmp_rgba32.bmp", im=rgba)
    put("bmp_555.bmp", data=bmp16(w, h, 12, "555"))
    put("bmp_565.bmp", data=bmp16(w, h, 13, "565"))
    put("bmp_4bit.bmp", data=bmp4(w, h, 14))
    put("bmp_4bit_topdown.bmp", data=bmp4(w, h, 15, top_down=True))
    put("bmp_v5_rgba.bmp", data=bmp32_v5(w, h, 16))
    # GIF
    put("gif_gray.gif", im=gray)
    put("gif_trns.gif", im=pal, transparency=5)
    put("gif_interlaced.gif", im=Image.fromarray(content(40, 40, 17)).convert("P"), interlace=True)
    gframes = [f.convert("P", palette=Image.ADAPTIVE, colors=60) for f in frames]
    put("gif_animated.gif", im=gframes[0], save_all=True, append_images=gframes[1:], duration=100)
    put("gif_offset_frame.gif", data=gif_with_screen(12, 9, (30, 20), (5, 7), 18))
    put("gif_frame_past_screen.gif", data=gif_with_screen(12, 9, (8, 8), (3, 2), 19))
    return out


def _exif_orientation(value):
    ex = Image.Exif()
    ex[0x0112] = value
    return ex.tobytes()
