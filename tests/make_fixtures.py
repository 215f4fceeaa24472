#!/usr/bin/env python3
"""Makes the checkpoint folders every test reads:  make_fixtures.py OUTDIR

A folder already made by the same generator with the same arguments is kept: each holds a
`.stamp` with a hash of tools/make_checkpoint.py and the arguments, written last.
"""
import hashlib
import json
import os
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import make_checkpoint  # noqa: E402

SEED = 0
FIXTURES = {
    # VLMs, newer naming, one file; the same seed, so the same values in every dtype.
    "tiny-f32": dict(preset="tiny", dtype="f32"),
    "tiny-bf16": dict(preset="tiny", dtype="bf16"),
    "tiny-f16": dict(preset="tiny", dtype="f16"),
    "tiny-old-sharded": dict(preset="tiny", dtype="bf16", naming="old", shards=3),
    # Gemma3ForCausalLM
    "tiny-text-f32": dict(preset="tiny-text", dtype="f32"),
    "tiny-text-bf16": dict(preset="tiny-text", dtype="bf16"),
    "tiny-text-f16": dict(preset="tiny-text", dtype="f16"),
    "tiny-text-sharded": dict(preset="tiny-text", dtype="f32", shards=2),
}


def stamp_of(args):
    with open(make_checkpoint.__file__, "rb") as f:
        h = hashlib.sha256(f.read())
    h.update(json.dumps(args, sort_keys=True).encode())
    return h.hexdigest()


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_fixtures.py OUTDIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, args in FIXTURES.items():
        args = dict(args, seed=SEED)
        d = os.path.join(out, name)
        stamp = stamp_of(args)
        try:
            with open(os.path.join(d, ".stamp")) as f:
                if f.read().strip() == stamp:
                    continue
        except OSError:
            pass
        # Build aside and move in, so a crash never leaves a half-written folder that looks done.
        tmp = f"{d}.tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        make_checkpoint.make(out=tmp, **args)
        with open(os.path.join(tmp, ".stamp"), "w") as f:
            f.write(stamp + "\n")
        shutil.rmtree(d, ignore_errors=True)
        os.rename(tmp, d)
        print(f"made {d}")


if __name__ == "__main__":
    main()
