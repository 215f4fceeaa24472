#!/usr/bin/env bash
# vlm against Hugging Face transformers itself (next to tests/oracle, our NumPy reference) on
# random tiny f32 checkpoints: an image prompt and a text-only one on the VLM, and a text model.
# Runs where python3 has torch and transformers (the lent device machine); CI's Debian has
# neither. Needs the tokenizer that tools/make_checkpoint.py copies (tools/npm: npm ci).
#   tests/hf/check.sh [VLM_BIN=build/vlm] [WORK=/tmp/vlm-hf]      (PY: python3)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
vlm=${1:-$here/build/vlm}
work=${2:-/tmp/vlm-hf}
py=${PY:-python3}
mkdir -p "$work"
"$py" -c "
import sys, numpy as np
from PIL import Image
Image.fromarray((np.random.default_rng(1).random((96, 80, 3)) * 255).astype(np.uint8)).save(sys.argv[1])" "$work/image.png"
"$py" "$here/tools/make_checkpoint.py" --preset tiny --dtype f32 --out "$work/tiny" >/dev/null
"$py" "$here/tools/make_checkpoint.py" --preset tiny-text --dtype f32 --out "$work/tiny-text" >/dev/null
image="Describe this image in detail." text="Why is the sky blue? Answer in one sentence."
dump=("$vlm" dump --steps 6 --precision f32)
"${dump[@]}" --model "$work/tiny" --prompt "$image" --image "$work/image.png" --out "$work/dump-image" >/dev/null
"${dump[@]}" --model "$work/tiny" --prompt "$text" --out "$work/dump-vlm-text" >/dev/null
"${dump[@]}" --model "$work/tiny-text" --prompt "$text" --out "$work/dump-text" >/dev/null
HF_HUB_OFFLINE=1 "$py" -u "$here/tests/hf/compare.py" "$work"
