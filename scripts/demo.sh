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
echo "== vlm run (text prompt, streamed; random weights, so the text is noise) =="
build/vlm run --model "$DEMO" --prompt "Write a haiku about the sea." --max-tokens 32
