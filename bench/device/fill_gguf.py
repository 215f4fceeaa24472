#!/usr/bin/env python3
"""A GGUF's header without its tensor data, and back: a 4B-shaped file made where it runs.

    fill_gguf.py --header MODEL.gguf HEADER   # HEADER: MODEL's bytes up to its data, + its size
    fill_gguf.py HEADER OUT                   # OUT: HEADER, then random small bf16 values

The 7.8 GB of a bf16 GGUF of the 4B shapes cannot travel to the device machine (64 MiB), its
6.5 MB header can. The data written are bf16 values of magnitude 2^-7 to 2^-6 and either sign
(f32 tensors read them in pairs: small values too), from a 64 MiB pool read at shifting offsets.
The file's total size travels as an 8-byte trailer after the header.
"""
import struct
import sys

import numpy as np

TYPE_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
TYPE_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def data_offset(b):
    """Where a GGUF v2/v3 file's tensor data begin (docs/gguf.md: the container)."""
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
    for _ in range(tensors):
        skip_string()
        dims = take("I")
        p += 8 * dims + 4 + 8
    return (p + alignment - 1) // alignment * alignment


def main(argv):
    if argv[0] == "--header":
        with open(argv[1], "rb") as f:
            head = f.read(64 << 20)
            size = f.seek(0, 2)
        n = data_offset(head)
        with open(argv[2], "wb") as f:
            f.write(head[:n] + struct.pack("<Q", size))
        return
    with open(argv[0], "rb") as f:
        head = f.read()
    head, size = head[:-8], struct.unpack("<Q", head[-8:])[0]
    n = 32 << 20
    bits = np.random.default_rng(0).integers(0, 1 << 16, n, dtype=np.uint16)
    pool = np.tile((bits & np.uint16(0x807F)) | np.uint16(0x3C00), 2).view(np.uint8)  # 2n values
    with open(argv[1], "wb") as f:
        f.write(head)
        left, k = size - len(head), 0
        while left > 0:
            at, c = (k * 7919 * 2) % (2 * n), min(left, 2 * n)  # even offsets: whole bf16 values
            f.write(pool[at:at + c])
            left, k = left - c, k + 1


if __name__ == "__main__":
    main(sys.argv[1:])
