"""The oracle's image processor (docs/gemma3/preprocessing.md): HF Gemma3ImageProcessor's slow path, with PIL.

    pv, num_crops = pixel_values([path, ...], size=64)        # float32 [n, 3, S, S]

Each image is opened with PIL and converted with `convert("RGB")` (no EXIF transpose: the
processor never applies one), optionally expanded by Pan & Scan into [image, crops...], resized
with `Image.resize((S, S), BILINEAR)` on the uint8 image, rescaled as f32(f64(u8) * factor) and
normalized as (x - f32(mean)) / f32(std) in float32, then laid out channel-first.
"""
import math

import numpy as np
from PIL import Image

RESCALE = 0.00392156862745098  # preprocessor_config.json rescale_factor (1/255)
MEAN = STD = (0.5, 0.5, 0.5)


def rgb_array(path):
    """HWC uint8 array of the file as PIL opens and converts it."""
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def pan_and_scan(arr, min_crop=256, max_crops=4, min_ratio=1.2):
    """docs/gemma3/preprocessing.md#pan-and-scan: the crops (row-major) of an HWC array;
    [] when Pan & Scan does not apply."""
    h, w = arr.shape[:2]
    if w >= h:
        if w / h < min_ratio:
            return []
        nw = int(math.floor(w / h + 0.5))
        nw = min(int(math.floor(w / min_crop)), nw)
        nw = min(max_crops, max(2, nw))
        nh = 1
    else:
        if h / w < min_ratio:
            return []
        nh = int(math.floor(h / w + 0.5))
        nh = min(int(math.floor(h / min_crop)), nh)
        nh = min(max_crops, max(2, nh))
        nw = 1
    cw, ch = int(math.ceil(w / nw)), int(math.ceil(h / nh))
    if min(cw, ch) < min_crop:
        return []
    return [arr[r * ch:r * ch + ch, c * cw:c * cw + cw] for r in range(nh) for c in range(nw)]


def resized_u8(arr, size):
    """PIL antialiased bilinear resize of an HWC uint8 array to size x size (a plain stretch)."""
    return np.asarray(Image.fromarray(arr).resize((size, size), Image.BILINEAR))


def normalize(u8, rescale=RESCALE, mean=MEAN, std=STD):
    """docs/gemma3/preprocessing.md#rescale: rescale, normalize and CHW of an HWC uint8 array -> float32."""
    x = (u8.astype(np.float64) * rescale).astype(np.float32)
    x = (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return x.transpose(2, 0, 1)


def pixel_values(paths, size, pan_scan=False):
    """(float32 [n, 3, size, size], num_crops per input image)."""
    out, num_crops = [], []
    for p in paths:
        arr = rgb_array(p)
        crops = pan_and_scan(arr) if pan_scan else []
        num_crops.append(len(crops))
        for a in [arr] + crops:
            out.append(normalize(resized_u8(a, size)))
    return np.stack(out), num_crops
