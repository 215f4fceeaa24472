#!/usr/bin/env python3
"""A small NumPy GGUF (version 3) writer and the ggml block quantizers vlm reads.

Layout and block formats: docs/gguf.md. Used by tools/convert_hf_to_gguf.py and the tests.

    w = GGUFWriter()
    w.add("general.architecture", "gemma3")              # type from the Python value
    w.add("gemma3.block_count", 6, "u32")                # or explicit
    w.add_tensor("token_embd.weight", array_f32, "q8_0") # shape as in PyTorch (slowest first)
    w.write(path)
"""
import struct

import numpy as np

ALIGNMENT = 32

# ggml.h enum ggml_type: id, values per block, bytes per block.
GGML_TYPES = {
    "f32": (0, 1, 4), "f16": (1, 1, 2), "q4_0": (2, 32, 18), "q4_1": (3, 32, 20), "q5_0": (6, 32, 22),
    "q5_1": (7, 32, 24), "q8_0": (8, 32, 34), "q2_k": (10, 256, 84), "q3_k": (11, 256, 110),
    "q4_k": (12, 256, 144), "q5_k": (13, 256, 176), "q6_k": (14, 256, 210),
    "iq4_nl": (20, 32, 18), "iq4_xs": (23, 256, 136), "bf16": (30, 1, 2),
}
GGML_NAMES = {v[0]: k for k, v in GGML_TYPES.items()}

# gguf.h enum gguf_type.
VT = {"u8": 0, "i8": 1, "u16": 2, "i16": 3, "u32": 4, "i32": 5, "f32": 6, "bool": 7, "string": 8,
      "array": 9, "u64": 10, "i64": 11, "f64": 12}
_PACK = {"u8": "<B", "i8": "<b", "u16": "<H", "i16": "<h", "u32": "<I", "i32": "<i", "f32": "<f",
         "bool": "<?", "u64": "<Q", "i64": "<q", "f64": "<d"}
_NP = {"u8": "<u1", "i8": "<i1", "u16": "<u2", "i16": "<i2", "u32": "<u4", "i32": "<i4", "f32": "<f4",
       "u64": "<u8", "i64": "<i8", "f64": "<f8"}


def _string(s):
    b = s.encode() if isinstance(s, str) else bytes(s)
    return struct.pack("<Q", len(b)) + b


def _guess(value):
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "u32" if 0 <= value < 2**32 else "i64"
    if isinstance(value, float):
        return "f32"
    if isinstance(value, (str, bytes)):
        return "string"
    raise TypeError(f"gguf_writer: no GGUF type for {type(value).__name__}; pass one")


def encode_value(value, vtype=None):
    """(type id, payload bytes). vtype 'array:<elem>' for arrays, e.g. 'array:string'."""
    vtype = vtype or _guess(value)
    if vtype.startswith("array:"):
        elem = vtype[6:]
        if elem == "string":
            body = b"".join(_string(s) for s in value)
        elif elem == "bool":
            body = bytes(int(bool(v)) for v in value)
        else:
            body = np.asarray(value, dtype=_NP[elem]).tobytes()
        return VT["array"], struct.pack("<IQ", VT[elem], len(value)) + body
    if vtype == "string":
        return VT["string"], _string(value)
    return VT[vtype], struct.pack(_PACK[vtype], value)


# ------------------------------------------------------------------ scalar conversions

def f32_to_bf16_bits(x):
    """Round to nearest even, NaN kept quiet (as torch)."""
    u = np.ascontiguousarray(x, dtype="<f4").view("<u4")
    r = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype("<u2")
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    r[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x40)).astype("<u2")
    return r


def _f16(x):
    return np.asarray(x, dtype=np.float32).astype("<f2")


# ------------------------------------------------------------------ block quantizers
# Each takes f32 rows [..., n] (n a multiple of the block size) and returns the block bytes
# row by row, in the layouts of ggml-common.h (block_q8_0, block_q4_0, block_q4_K, block_q6_K).

def quantize_q8_0(x):
    b = np.asarray(x, np.float32).reshape(-1, 32)
    amax = np.abs(b).max(axis=1)
    d = amax / np.float32(127)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    # ggml rounds half away from zero (roundf)
    v = b * inv[:, None]
    q = (np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))).astype(np.int8)
    out = np.zeros((b.shape[0], 34), np.uint8)
    out[:, 0:2] = _f16(d).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.tobytes()


def _signed_max(b):
    """The value of largest magnitude of each row (last axis), sign kept (the first of equals)."""
    idx = np.abs(b).argmax(axis=-1)
    return np.take_along_axis(b, idx[..., None], axis=-1)[..., 0]


def _offset_codes(b, offset):
    """ggml's quantize_row_q4_0_ref / _q5_0_ref rule for rows of 32: the value of largest magnitude, sign
    kept, maps to -offset; codes are x/d + offset + 0.5 truncated, at most 2*offset - 1. Returns d, codes."""
    d = _signed_max(b) / np.float32(-offset)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    q = np.minimum(2 * offset - 1, (b * inv[:, None] + np.float32(offset + 0.5)).astype(np.int8)).astype(np.uint8)
    return d, q


def quantize_q4_0(x):
    b = np.asarray(x, np.float32).reshape(-1, 32)
    d, q = _offset_codes(b, 8)
    out = np.zeros((b.shape[0], 18), np.uint8)
    out[:, 0:2] = _f16(d).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q[:, :16] | (q[:, 16:] << 4)
    return out.tobytes()


def _q5_pack(q, out, at):
    """32 5-bit codes per row of q: nibbles as Q4_0's at out[:, at + 4:], the fifth bits (bit j: value j)
    at out[:, at:at + 4]."""
    out[:, at + 4:at + 20] = (q[:, :16] & 15) | ((q[:, 16:] & 15) << 4)
    qh = ((q.astype(np.uint32) >> 4) & 1) << np.arange(32, dtype=np.uint32)
    out[:, at:at + 4] = qh.sum(axis=1, dtype=np.uint32).astype("<u4").view(np.uint8).reshape(-1, 4)


def quantize_q5_0(x):
    """ggml's quantize_row_q5_0_ref: the value of largest magnitude, sign kept, maps to -16."""
    b = np.asarray(x, np.float32).reshape(-1, 32)
    d, q = _offset_codes(b, 16)
    out = np.zeros((b.shape[0], 22), np.uint8)
    out[:, 0:2] = _f16(d).view(np.uint8).reshape(-1, 2)
    _q5_pack(q, out, 2)
    return out.tobytes()


def _min_max_codes(x, top):
    """ggml's quantize_row_q4_1_ref / _q5_1_ref rule for rows of 32: [min, max] in `top` steps, codes
    (x - min)/d + 0.5 truncated, at most top. Returns the output rows (d and min written) and the codes."""
    b = np.asarray(x, np.float32).reshape(-1, 32)
    lo, hi = b.min(axis=1), b.max(axis=1)
    d = (hi - lo) / np.float32(top)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    q = np.minimum(top, ((b - lo[:, None]) * inv[:, None] + np.float32(0.5)).astype(np.uint8))
    out = np.zeros((b.shape[0], 4 + (16 if top == 15 else 20)), np.uint8)
    out[:, 0:2] = _f16(d).view(np.uint8).reshape(-1, 2)
    out[:, 2:4] = _f16(lo).view(np.uint8).reshape(-1, 2)
    return out, q


def quantize_q4_1(x):
    """value = d*q + m, q in 0..15: d, m, then the nibbles as Q4_0's."""
    out, q = _min_max_codes(x, 15)
    out[:, 4:] = q[:, :16] | (q[:, 16:] << 4)
    return out.tobytes()


def quantize_q5_1(x):
    """value = d*q + m, q in 0..31: d, m, then the fifth bits and nibbles as Q5_0's."""
    out, q = _min_max_codes(x, 31)
    _q5_pack(q, out, 4)
    return out.tobytes()


def _pack_2bit(q):
    """The 64 bytes of two low code bits of 256 codes per row: 32 bytes per half of 128, value 32k + l
    of a half (l < 32) in bits 2k, 2k+1 of byte l."""
    q = (q.reshape(-1, 2, 4, 32) & 3).astype(np.uint8)
    return (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(-1, 64)


def quantize_q2_k(x):
    """Super-blocks of 16 sub-blocks of 16: value = d*sc*q - dmin*m, 4-bit sc and m, 2-bit q (a plain
    min/max fit as quantize_q4_k's). Bytes: scales (sc | m << 4), codes, d, dmin."""
    d16, dmin16, sc, m, q = _affine_fit(np.asarray(x, np.float32).reshape(-1, 16, 16), 3, 15)
    out = np.zeros((q.shape[0], 84), np.uint8)
    out[:, 0:16] = sc | (m << 4)
    out[:, 16:80] = _pack_2bit(q)
    out[:, 80:82] = d16.view(np.uint8).reshape(-1, 2)
    out[:, 82:84] = dmin16.view(np.uint8).reshape(-1, 2)
    return out.tobytes()


def quantize_q3_k(x):
    """Super-blocks of 16 sub-blocks of 16: value = d*(sc-32)*(q-4), 6-bit sc, 3-bit q; each sub-block's
    value of largest magnitude maps to -4. Bytes: hmask (bit j of byte l: the third bit of value 32j + l),
    the two low bits as Q2_K's, 12 bytes of scales (low nibbles of 0-7 in bytes 0-7, of 8-15 in their
    high nibbles; top two bits of sub-block j at bits 2*(j//4) of byte 8 + j%4), d."""
    b = np.asarray(x, np.float32).reshape(-1, 16, 16)
    s = _signed_max(b) / np.float32(-4)
    d16 = _f16(np.abs(s).max(axis=1) / np.float32(31))
    d = d16.astype(np.float32)
    lv = np.where(d[:, None] > 0, np.rint(s / np.where(d > 0, d, 1)[:, None]), 0).clip(-32, 31).astype(np.int32)
    eff = d[:, None] * lv.astype(np.float32)
    q = (np.where(eff[:, :, None] != 0, np.rint(b / np.where(eff != 0, eff, 1)[:, :, None]), 0).clip(-4, 3) + 4)
    q = q.astype(np.uint8).reshape(-1, 8, 32)
    sc = (lv + 32).astype(np.uint8)
    out = np.zeros((b.shape[0], 110), np.uint8)
    out[:, 0:32] = sum(((q[:, j] >> 2) << j).astype(np.uint8) for j in range(8))
    out[:, 32:96] = _pack_2bit(q.reshape(-1, 256))
    out[:, 96:104] = (sc[:, 0:8] & 15) | ((sc[:, 8:16] & 15) << 4)
    out[:, 104:108] = sum(((sc[:, 4 * g:4 * g + 4] >> 4) << (2 * g)).astype(np.uint8) for g in range(4))
    out[:, 108:110] = d16.view(np.uint8).reshape(-1, 2)
    return out.tobytes()


# ggml-common.h kvalues_iq4nl: the values of the 16 IQ4 codes before the block scale.
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


def _iq4_nibbles(b, e):
    """Nibbles (Q4_0's order) of the nearest codebook entries to b / e, rows of 32 values."""
    t = np.where(e[:, None] != 0, b / np.where(e != 0, e, 1)[:, None], 0)
    q = np.abs(t[:, :, None] - IQ4_VALUES[None, None, :]).argmin(axis=2).astype(np.uint8)
    return q[:, :16] | (q[:, 16:] << 4)


def quantize_iq4_nl(x):
    """Blocks of 32: value = d*kvalues[q]; the value of largest magnitude maps to -127 (no search)."""
    b = np.asarray(x, np.float32).reshape(-1, 32)
    d16 = _f16(_signed_max(b) / np.float32(-127))
    out = np.zeros((b.shape[0], 18), np.uint8)
    out[:, 0:2] = d16.view(np.uint8).reshape(-1, 2)
    out[:, 2:] = _iq4_nibbles(b, d16.astype(np.float32))
    return out.tobytes()


def quantize_iq4_xs(x):
    """Super-blocks of 8 sub-blocks of 32: value = d*(ls-32)*kvalues[q], 6-bit ls per sub-block."""
    b = np.asarray(x, np.float32).reshape(-1, 8, 32)
    s = _signed_max(b) / np.float32(-127)                          # [n, 8] wanted sub-block scales
    d16 = _f16(np.abs(s).max(axis=1) / np.float32(31))
    d = d16.astype(np.float32)
    lv = np.where(d[:, None] > 0, np.rint(s / np.where(d > 0, d, 1)[:, None]), 0).clip(-32, 31).astype(np.int32)
    ls = (lv + 32).astype(np.uint32)
    out = np.zeros((b.shape[0], 136), np.uint8)
    out[:, 0:2] = d16.view(np.uint8).reshape(-1, 2)
    out[:, 2:4] = ((ls >> 4) << (2 * np.arange(8, dtype=np.uint32))).sum(axis=1).astype("<u2").view(np.uint8).reshape(-1, 2)
    out[:, 4:8] = ((ls[:, 0::2] & 15) | ((ls[:, 1::2] & 15) << 4)).astype(np.uint8)
    e = (d[:, None] * lv.astype(np.float32)).astype(np.float32).reshape(-1)
    out[:, 8:] = _iq4_nibbles(b.reshape(-1, 32), e).reshape(-1, 128)
    return out.tobytes()


def _affine_fit(b, top, steps):
    """The K-quants with a min, for super-blocks b [n, sub-blocks, values]: each sub-block's scale
    (max - min)/top and offset -min (min <= 0) as codes 0..steps of the f16 d and dmin (the largest of
    each / steps); codes rint((x + dmin*m)/(d*sc)) in 0..top. Returns d16, dmin16, sc, m, q (uint8)."""
    lo = np.minimum(b.min(axis=2), 0)
    scale, mins = (b.max(axis=2) - lo) / np.float32(top), -lo
    d16, dmin16 = _f16(scale.max(axis=1) / np.float32(steps)), _f16(mins.max(axis=1) / np.float32(steps))
    df, dminf = d16.astype(np.float32), dmin16.astype(np.float32)
    sc = np.where(df[:, None] > 0, np.rint(scale / np.where(df > 0, df, 1)[:, None]), 0).clip(0, steps).astype(np.uint8)
    m = np.where(dminf[:, None] > 0, np.rint(mins / np.where(dminf > 0, dminf, 1)[:, None]), 0).clip(0, steps).astype(np.uint8)
    eff_d, eff_m = df[:, None] * sc, dminf[:, None] * m
    q = np.where(eff_d[:, :, None] > 0, np.rint((b + eff_m[:, :, None]) / np.where(eff_d > 0, eff_d, 1)[:, :, None]), 0)
    return d16, dmin16, sc, m, q.clip(0, top).astype(np.uint8)


def quantize_q4_k(x, bits=4):
    """Super-blocks of 8 sub-blocks of 32: value = d*sc*q - dmin*m with 6-bit sc, m and 4-bit q
    (Q5_K, bits=5: 5-bit q, its fifth bits in 32 bytes qh before the nibbles).

    A plain min/max fit per sub-block (not ggml's iterative search): valid blocks whose values
    approximate x; the format, not the fit, is what readers must get right.
    """
    b = np.asarray(x, np.float32).reshape(-1, 8, 32)
    d16, dmin16, sc, m, q = _affine_fit(b, (1 << bits) - 1, 63)
    scales = np.zeros((b.shape[0], 12), np.uint8)
    scales[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = (m[:, 0:4] & 63) | ((m[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 15) | ((m[:, 4:8] & 15) << 4)
    low = q & 15
    qs = (low[:, 0::2, :] | (low[:, 1::2, :] << 4)).reshape(-1, 128)  # pairs of sub-blocks share bytes
    qh = np.zeros((b.shape[0], 32), np.uint8)
    for j in range(8):  # bit j of qh[l]: the fifth bit of value l of sub-block j
        qh |= ((q[:, j, :] >> 4) << j).astype(np.uint8)
    out = np.zeros((b.shape[0], 144 if bits == 4 else 176), np.uint8)
    out[:, 0:2] = d16.view(np.uint8).reshape(-1, 2)
    out[:, 2:4] = dmin16.view(np.uint8).reshape(-1, 2)
    out[:, 4:16] = scales
    if bits == 5:
        out[:, 16:48] = qh
    out[:, -128:] = qs
    return out.tobytes()


def quantize_q5_k(x):
    return quantize_q4_k(x, bits=5)


def quantize_q6_k(x):
    """Super-blocks of 16 sub-blocks of 16: value = d*sc*(q-32), int8 sc and 6-bit q."""
    b = np.asarray(x, np.float32).reshape(-1, 16, 16)
    amax = np.abs(b).max(axis=2)
    scale = amax / np.float32(31)
    d = np.abs(scale).max(axis=1) / np.float32(127)
    d16 = _f16(d)
    df = d16.astype(np.float32)
    sc = np.where(df[:, None] > 0, np.rint(scale / np.where(df > 0, df, 1)[:, None]), 0).clip(-128, 127).astype(np.int8)
    eff = df[:, None] * sc
    q = np.where(eff[:, :, None] != 0, np.rint(b / np.where(eff != 0, eff, 1)[:, :, None]), 0).clip(-32, 31)
    q = (q + 32).astype(np.uint8).reshape(-1, 2, 128)  # two halves of 128
    ql = np.zeros((b.shape[0], 2, 64), np.uint8)
    qh = np.zeros((b.shape[0], 2, 32), np.uint8)
    q0, q1, q2, q3 = q[:, :, 0:32], q[:, :, 32:64], q[:, :, 64:96], q[:, :, 96:128]
    ql[:, :, 0:32] = (q0 & 15) | ((q2 & 15) << 4)
    ql[:, :, 32:64] = (q1 & 15) | ((q3 & 15) << 4)
    qh[:, :, :] = (q0 >> 4) | ((q1 >> 4) << 2) | ((q2 >> 4) << 4) | ((q3 >> 4) << 6)
    out = np.zeros((b.shape[0], 210), np.uint8)
    out[:, 0:128] = ql.reshape(-1, 128)
    out[:, 128:192] = qh.reshape(-1, 64)
    out[:, 192:208] = sc.view(np.uint8)
    out[:, 208:210] = d16.view(np.uint8).reshape(-1, 2)
    return out.tobytes()


def dequantize(data, gtype, n):
    """f32 values of n elements stored as gtype (NumPy reference of the formats, for tests)."""
    buf = np.frombuffer(data, np.uint8)
    if gtype == "f32":
        return buf.view("<f4")[:n].copy()
    if gtype == "f16":
        return buf.view("<f2")[:n].astype(np.float32)
    if gtype == "bf16":
        return (buf.view("<u2")[:n].astype(np.uint32) << 16).view(np.float32)
    _, be, bb = GGML_TYPES[gtype]
    blk = buf.reshape(-1, bb)
    f16 = lambda a: a.copy().view("<f2").astype(np.float32).reshape(-1)  # noqa: E731
    if gtype == "q8_0":
        return (blk[:, 2:].view(np.int8).astype(np.float32) * f16(blk[:, 0:2])[:, None]).reshape(-1)
    if gtype == "q4_0":
        q = np.concatenate([blk[:, 2:] & 15, blk[:, 2:] >> 4], axis=1).astype(np.float32) - 8
        return (q * f16(blk[:, 0:2])[:, None]).reshape(-1)
    if gtype == "q4_1":
        q = np.concatenate([blk[:, 4:] & 15, blk[:, 4:] >> 4], axis=1).astype(np.float32)
        return ((q * f16(blk[:, 0:2])[:, None]).astype(np.float32) + f16(blk[:, 2:4])[:, None]).reshape(-1)
    if gtype in ("q2_k", "q3_k"):
        qs = blk[:, 16:80] if gtype == "q2_k" else blk[:, 32:96]
        q = np.stack([(qs.reshape(-1, 2, 32) >> (2 * k)) & 3 for k in range(4)], axis=2).reshape(-1, 256)
        if gtype == "q2_k":
            d, dmin = f16(blk[:, 80:82]), f16(blk[:, 82:84])
            d1 = (d[:, None] * (blk[:, 0:16] & 15).astype(np.float32)).astype(np.float32)
            m1 = (dmin[:, None] * (blk[:, 0:16] >> 4).astype(np.float32)).astype(np.float32)
            return (np.repeat(d1, 16, axis=1) * q.astype(np.float32) - np.repeat(m1, 16, axis=1)).astype(np.float32).reshape(-1)
        e = np.arange(256)
        q = q | (((blk[:, e % 32] >> (e // 32)) & 1) << 2)
        s, j = blk[:, 96:108].astype(np.int32), np.arange(16)
        sc = ((s[:, j % 8] >> (4 * (j // 8))) & 15) | (((s[:, 8 + j % 4] >> (2 * (j // 4))) & 3) << 4)
        dl = (f16(blk[:, 108:110])[:, None] * (sc - 32).astype(np.float32)).astype(np.float32)
        return (np.repeat(dl, 16, axis=1) * (q.astype(np.float32) - 4)).astype(np.float32).reshape(-1)
    if gtype in ("q5_0", "q5_1"):
        at = 2 if gtype == "q5_0" else 4
        qs = blk[:, at + 4:at + 20]
        qh = blk[:, at:at + 4].copy().view("<u4").reshape(-1, 1)
        q = np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.uint32)
        q = (q | (((qh >> np.arange(32, dtype=np.uint32)) & 1) << 4)).astype(np.float32)
        if gtype == "q5_0":
            return ((q - 16) * f16(blk[:, 0:2])[:, None]).reshape(-1)
        return ((q * f16(blk[:, 0:2])[:, None]).astype(np.float32) + f16(blk[:, 2:4])[:, None]).reshape(-1)
    if gtype in ("iq4_nl", "iq4_xs"):
        qs = blk[:, 2:] if gtype == "iq4_nl" else blk[:, 8:]
        qs = qs.reshape(-1, 16)                                       # 16 bytes per 32 values
        v = IQ4_VALUES[np.concatenate([qs & 15, qs >> 4], axis=1)]  # [groups of 32, 32]
        if gtype == "iq4_nl":
            return (f16(blk[:, 0:2])[:, None] * v).astype(np.float32).reshape(-1)
        sh = blk[:, 2:4].copy().view("<u2").astype(np.int32)         # [n, 1]
        sl = blk[:, 4:8].astype(np.int32)
        j = np.arange(8)
        ls = ((sl[:, j // 2] >> (4 * (j % 2))) & 15) | (((sh >> (2 * j)) & 3) << 4)
        dl = (f16(blk[:, 0:2])[:, None] * (ls - 32).astype(np.float32)).astype(np.float32).reshape(-1)
        return (dl[:, None] * v).astype(np.float32).reshape(-1)
    if gtype in ("q4_k", "q5_k"):
        d, dmin, s = f16(blk[:, 0:2]), f16(blk[:, 2:4]), blk[:, 4:16].astype(np.uint8)
        sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)], axis=1)
        m = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
        qs = blk[:, -128:].reshape(-1, 4, 32)
        q = np.stack([qs & 15, qs >> 4], axis=2).reshape(-1, 8, 32)
        if gtype == "q5_k":  # sub-block j's fifth bits: bit j of the 32 bytes qh
            qh = blk[:, 16:48]
            q = q | np.stack([((qh >> j) & 1) << 4 for j in range(8)], axis=1)
        q = q.astype(np.float32)
        d1 = (d[:, None] * sc.astype(np.float32)).astype(np.float32)
        m1 = (dmin[:, None] * m.astype(np.float32)).astype(np.float32)
        return (d1[:, :, None] * q - m1[:, :, None]).astype(np.float32).reshape(-1)
    if gtype == "q6_k":
        ql = blk[:, 0:128].reshape(-1, 2, 64)
        qh = blk[:, 128:192].reshape(-1, 2, 32)
        sc = blk[:, 192:208].view(np.int8).reshape(-1, 2, 8).astype(np.float32)
        d = f16(blk[:, 208:210])
        q0 = (ql[:, :, 0:32] & 15) | ((qh & 3) << 4)
        q1 = (ql[:, :, 32:64] & 15) | (((qh >> 2) & 3) << 4)
        q2 = (ql[:, :, 0:32] >> 4) | (((qh >> 4) & 3) << 4)
        q3 = (ql[:, :, 32:64] >> 4) | (((qh >> 6) & 3) << 4)
        q = np.concatenate([q0, q1, q2, q3], axis=2).astype(np.float32) - 32  # [n, 2, 128]
        s = np.repeat(sc.reshape(-1, 2, 8), 16, axis=2)  # element l of a half uses sc[l // 16]
        ds = (d[:, None, None] * s).astype(np.float32)
        return (ds * q).astype(np.float32).reshape(-1)
    raise ValueError(gtype)


QUANTIZERS = {"q8_0": quantize_q8_0, "q4_0": quantize_q4_0, "q4_1": quantize_q4_1, "q5_0": quantize_q5_0,
              "q5_1": quantize_q5_1, "q2_k": quantize_q2_k, "q3_k": quantize_q3_k,
              "q4_k": quantize_q4_k, "q5_k": quantize_q5_k, "iq4_nl": quantize_iq4_nl, "iq4_xs": quantize_iq4_xs,
              "q6_k": quantize_q6_k}


def encode_tensor(x, gtype):
    """Bytes of an f32 array stored as gtype (blocks along the last axis)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if gtype == "f32":
        return x.astype("<f4").tobytes()
    if gtype == "f16":
        return x.astype("<f2").tobytes()
    if gtype == "bf16":
        return f32_to_bf16_bits(x).tobytes()
    be = GGML_TYPES[gtype][1]
    if x.shape[-1] % be:
        raise ValueError(f"gguf_writer: last dimension {x.shape[-1]} is not a multiple of the {gtype} block {be}")
    return QUANTIZERS[gtype](x)


class GGUFWriter:
    def __init__(self, alignment=ALIGNMENT):
        self.kv = []       # (key, type id, payload)
        self.tensors = []  # (name, ne, type id, byte count, () -> bytes)
        self.alignment = alignment
        if alignment != ALIGNMENT:
            self.add("general.alignment", alignment, "u32")

    def add(self, key, value, vtype=None):
        t, payload = encode_value(value, vtype)
        self.kv.append((key, t, payload))

    def add_tensor(self, name, x, gtype="f32"):
        """x: f32 array in PyTorch order (slowest dimension first), or an object with `.shape`
        that returns that array when called: then it is read and encoded only while the file is
        written, one tensor at a time, so a file larger than memory streams."""
        if callable(x):
            self._add(name, x.shape, gtype, lambda: encode_tensor(x(), gtype))
        else:
            data = encode_tensor(x, gtype)
            self._add(name, np.shape(x), gtype, lambda: data)

    def add_raw_tensor(self, name, shape, gtype, data):
        self._add(name, shape, gtype, lambda: data)

    def _add(self, name, shape, gtype, produce):
        tid, be, bb = GGML_TYPES[gtype]
        ne = list(reversed([int(d) for d in shape]))
        n = int(np.prod(ne)) if ne else 1
        self.tensors.append((name, ne, tid, n // be * bb, produce))

    def write(self, path):
        head = bytearray(b"GGUF")
        head += struct.pack("<IQQ", 3, len(self.tensors), len(self.kv))
        for key, t, payload in self.kv:
            head += _string(key) + struct.pack("<I", t) + payload
        offset = 0
        offsets = []
        for name, ne, tid, nbytes, _ in self.tensors:
            head += _string(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
            head += struct.pack("<IQ", tid, offset)
            offsets.append(offset)
            offset += nbytes
            offset += -offset % self.alignment
        head += b"\0" * (-len(head) % self.alignment)
        with open(path, "wb") as f:
            f.write(head)
            pos = 0
            for (name, ne, _, nbytes, produce), off in zip(self.tensors, offsets):
                data = produce()
                if len(data) != nbytes:
                    raise ValueError(f"gguf_writer: tensor '{name}': {len(data)} bytes for ne {ne}, {nbytes} expected")
                f.write(b"\0" * (off - pos))
                f.write(data)
                pos = off + len(data)
            f.write(b"\0" * (-pos % self.alignment))


def read(path):
    """(metadata dict, {name: (ggml type name, shape, bytes)}) of a GGUF file; for tests."""
    with open(path, "rb") as f:
        buf = memoryview(f.read())
    pos = 0

    def take(n):
        nonlocal pos
        b = buf[pos:pos + n]
        if len(b) != n:
            raise ValueError("truncated")
        pos += n
        return b

    def u(fmt):
        return struct.unpack(fmt, take(struct.calcsize(fmt)))[0]

    def s():
        return bytes(take(u("<Q"))).decode()

    def value(t):
        name = {v: k for k, v in VT.items()}[t]
        if name == "string":
            return s()
        if name == "array":
            et, n = u("<I"), u("<Q")
            return [value(et) for _ in range(n)]
        return u(_PACK[name])

    if bytes(take(4)) != b"GGUF":
        raise ValueError("not GGUF")
    version, nt, nkv = u("<I"), u("<Q"), u("<Q")
    meta = {"_version": version}
    for _ in range(nkv):
        k = s()
        meta[k] = value(u("<I"))
    infos = []
    for _ in range(nt):
        name = s()
        ne = [u("<Q") for _ in range(u("<I"))]
        infos.append((name, ne, u("<I"), u("<Q")))
    align = meta.get("general.alignment", ALIGNMENT)
    start = pos + (-pos % align)
    tensors = {}
    for name, ne, tid, off in infos:
        gname = GGML_NAMES[tid]
        _, be, bb = GGML_TYPES[gname]
        n = int(np.prod(ne))
        tensors[name] = (gname, list(reversed(ne)), bytes(buf[start + off:start + off + n // be * bb]))
    return meta, tensors
