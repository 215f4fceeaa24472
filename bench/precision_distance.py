"""How far --precision bf16 lands from --precision f32 on a checkpoint: for each prompt, `vlm dump`
at both precisions, then the max |Δlogit| over every prompt position (same inputs, so only the
precision differs), relative to the max |logit|, whether the top-1 id agrees at every prompt
position, and how many of N greedy tokens agree before the first difference.
Usage: /usr/bin/python3 bench/precision_distance.py VLM_BIN MODEL_DIR [STEPS=32] [THREADS=2]"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

PROMPTS = ["Why is the sky blue?", "Write a haiku about the sea.", "List three prime numbers.",
           "Translate 'good morning' into French.", "What is 17 times 23?"]


def main():
    vlm, model = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 32
    threads = sys.argv[4] if len(sys.argv) > 4 else "2"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, p in enumerate(PROMPTS):
            out = {}
            for prec in ("f32", "bf16"):
                d = os.path.join(tmp, f"{i}-{prec}")
                subprocess.run([vlm, "dump", "--model", model, "--prompt", p, "--out", d, "--steps", str(steps),
                                "--threads", threads, "--precision", prec], check=True, capture_output=True)
                with open(os.path.join(d, "greedy.json")) as f:
                    out[prec] = (np.load(os.path.join(d, "logits.npy")), json.load(f))
            (l32, g32), (l16, g16) = out["f32"], out["bf16"]
            diff = float(np.abs(l16 - l32).max())
            agree = next((k for k, (a, b) in enumerate(zip(g32, g16)) if a != b), len(g32))
            top1 = int((l16.argmax(-1) == l32.argmax(-1)).sum())
            rows.append((diff, diff / float(np.abs(l32).max()), top1, len(l32), agree))
            print(f"prompt {i}: max |dlogit| {diff:.4f} ({rows[-1][1]:.2e} of max |logit|), top-1 {top1}/{len(l32)}, "
                  f"greedy agree {agree}/{steps}", flush=True)
    print(json.dumps({"max_dlogit": max(r[0] for r in rows), "max_rel": max(r[1] for r in rows),
                      "top1": [sum(r[2] for r in rows), sum(r[3] for r in rows)],
                      "greedy_agree": [r[4] for r in rows], "steps": steps}))


if __name__ == "__main__":
    main()
