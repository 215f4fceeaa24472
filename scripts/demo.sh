#!/usr/bin/env bash
# The main job on the built-in demo: sets up, builds, makes a tiny Gemma 3 VLM
# checkpoint with RANDOM weights (and the real Gemma 3 tokenizer) and runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
DEMO=demo/tiny
if [ ! -f "$DEMO/config.json" ]; then
  /usr/bin/python3 tools/make_checkpoint.py --preset tiny --dtype bf16 --out "$DEMO" --seed 0
fi
echo "== demo checkpoint: $DEMO (tiny Gemma 3 VLM, random weights: its answers are noise) =="
build/vlm inspect --model "$DEMO"
# A generated picture (a sun over a striped sea), so the demo needs no files of its own.
PICTURE=demo/picture.png
if [ ! -f "$PICTURE" ]; then
  /usr/bin/python3 - "$PICTURE" <<'PY'
import sys
from PIL import Image, ImageDraw
im = Image.new("RGB", (320, 240), (120, 180, 235))
d = ImageDraw.Draw(im)
for i, y in enumerate(range(150, 240, 15)):
    d.rectangle([0, y, 320, y + 15], fill=(20, 60 + 20 * (i % 2), 140))
d.ellipse([200, 30, 270, 100], fill=(250, 210, 60))
im.save(sys.argv[1])
PY
fi
echo "== vlm run (the picture and a question, streamed; random weights, so the answer is noise) =="
build/vlm run --model "$DEMO" --image "$PICTURE" --prompt "What is in this picture?" --max-tokens 32
