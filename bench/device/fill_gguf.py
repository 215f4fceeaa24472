#!/usr/bin/env python3
"""A GGUF's header without its tensor data, and back: a 4B-shaped file made where it runs.

    fill_gguf.py --header MODEL.gguf HEADER   # HEADER: MODEL's bytes up to its data, + its size
    fill_gguf.py HEADER OUT                   # OUT: HEADER, then random small values

The 7.8 GB of a bf16 GGUF of the 4B shapes (4.1 GB as Q8_0, 2.5 GB as Q4_K_M) cannot travel to
the device machine (64 MiB), its 6.5 MB header can. Each tensor is filled by its type from a pool
of valid random data read at shifting offsets: bf16 values of magnitude 2^-7 to 2^-6 and either
sign (f32 tensors read them in pairs: small values too); F16 values as small; the blocks of
Q8_0, Q4_0, Q4_K and Q6_K with random codes and small finite f16 scales (docs/gguf.md, the block
formats), so no value is Inf or NaN. The file's total size travels as an 8-byte trailer.
"""
import struct
import sys

import numpy as np

TYPE_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
TYPE_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


# ggml type: (bytes per block, values per block, the f16 scales' byte offsets in a block and
# their magnitude). F32, F16, BF16 have no scales.
BLOCKS = {0: (4, 1, (), 0), 1: (2, 1, (), 0), 30: (2, 1, (), 0), 2: (18, 32, (0,), 2e-4),
          8: (34, 32, (0,), 1e-4), 12: (144, 256, (0, 2), 1e-5), 14: (210, 256, (208,), 2e-6)}


def data_offset(b):
    """Where a GGUF v2/v3 file's tensor data begin (docs/gguf.md: the container), and its tensors
    as (type, offset from there, values)."""
    p = 0

    def take(fmt):
        nonlocal p
        v = struct.unpack_from("<" + fmt, b, p)[0]
        p += struct.calcsize(fmt)
        return v

    def skip_string():
        nonlocal p
        n = take("Q")  # before the +=, which would read p first
        p += n

    if b[:4] != b"GGUF":
        raise SystemExit("fill_gguf: not a GGUF file")
    p = 4
    take("I")
    tensors, kvs = take("Q"), take("Q")
    alignment = 32
    for _ in range(kvs):
        n = take("Q")
        key = bytes(b[p:p + n])
        p += n
        t = take("I")
        if t == 8:
            skip_string()
        elif t == 9:
            et, count = take("I"), take("Q")
            if et == 8:
                for _ in range(count):
                    skip_string()
            else:
                p += TYPE_SIZES[et] * count
        else:
            v = take(TYPE_FORMATS[t])
            if key == b"general.alignment":
                alignment = v
    infos = []
    for _ in range(tensors):
        skip_string()
        dims = take("I")
        values = 1
        for _ in range(dims):
            values *= take("Q")
        infos.append((take("I"), take("Q"), values))
    return (p + alignment - 1) // alignment * alignment, infos


def pool(t, rng, n=8 << 20):
    """About n bytes of valid data of ggml type t, whole blocks."""
    if t not in BLOCKS:
        raise SystemExit(f"fill_gguf: ggml type {t} is not one this script fills")
    size, _, scales, mag = BLOCKS[t]
    if t == 1:
        return (rng.uniform(-1, 1, n // 2) * 2 ** -6).astype(np.float16).view(np.uint8)
    if size <= 4:  # bf16 values, also read in pairs as f32
        bits = rng.integers(0, 1 << 16, n // 2, dtype=np.uint16)
        return ((bits & np.uint16(0x807F)) | np.uint16(0x3C00)).view(np.uint8)
    blocks = rng.integers(0, 256, (n // size, size), dtype=np.uint8)
    for at in scales:
        d = (rng.uniform(0.5, 1.0, len(blocks)) * mag).astype(np.float16)
        blocks[:, at:at + 2] = d.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(-1)


def main(argv):
    if argv[0] == "--header":
        with open(argv[1], "rb") as f:
            head = f.read(64 << 20)
            size = f.seek(0, 2)
        n = data_offset(head)[0]
        with open(argv[2], "wb") as f:
            f.write(head[:n] + struct.pack("<Q", size))
        return
    with open(argv[0], "rb") as f:
        head = f.read()
    head, size = head[:-8], struct.unpack("<Q", head[-8:])[0]
    start, infos = data_offset(head)
    rng = np.random.default_rng(0)
    pools = {t: pool(t, rng) for t in {t for t, _, _ in infos}}
    with open(argv[1], "wb") as f:
        f.write(head)
        at, k = 0, 0
        for t, offset, values in sorted(infos, key=lambda i: i[1]):
            f.write(bytes(offset - at))  # alignment padding
            bsize, bvalues = BLOCKS[t][:2]
            left, src = values // bvalues * bsize, pools[t]
            while left > 0:  # whole blocks from shifting places in the pool
                s0 = (k * 7919 % (len(src) // bsize)) * bsize
                c = min(left, len(src) - s0)
                f.write(src[s0:s0 + c])
                left, k = left - c, k + 1
            at = offset + values // bvalues * bsize
        f.write(bytes(size - start - at))


if __name__ == "__main__":
    main(sys.argv[1:])
