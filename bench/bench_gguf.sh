#!/usr/bin/env bash
# Decode tokens/s of vlm (bench_decoder) and llama.cpp (npm node-llama-cpp) on the same GGUF files
# of one checkpoint folder, BF16 / Q8_0 / Q4_K_M, in one run, with each side's peak RSS. Files are
# made once into OUT_DIR (bf16 by tools/convert_hf_to_gguf.py, the others by `vlm quantize`).
# Run it on a quiet machine: decode is memory-bound and other jobs move the numbers.
# Usage: bench/bench_gguf.sh [CKPT_DIR] [OUT_DIR] [DECODE_TOKENS] [TYPES...]
#   defaults /work/ckpt/gemma3-4b, /work/ckpt/gguf, 16, "bf16 q8_0 q4_k_m"; VLM_THREADS (default 2),
#   VLM_BUILD (default build).
set -euo pipefail
cd "$(dirname "$0")/.."
CKPT=${1:-/work/ckpt/gemma3-4b}
OUT=${2:-/work/ckpt/gguf}
N=${3:-16}
shift $(( $# < 3 ? $# : 3 ))
TYPES=${*:-bf16 q8_0 q4_k_m}
THREADS=${VLM_THREADS:-2}
BUILD=${VLM_BUILD:-build}
PROMPT=32
mkdir -p "$OUT"
name=$(basename "$CKPT")
for t in $TYPES; do
  f="$OUT/$name-$t.gguf"
  if [ ! -f "$f" ]; then
    if [ "$t" = bf16 ]; then
      /usr/bin/python3 tools/convert_hf_to_gguf.py "$CKPT" --out "$f" --type bf16
    else
      "$BUILD/vlm" quantize --model "$CKPT" --type "$t" --out "$f"
    fi
  fi
done
for t in $TYPES; do
  f="$OUT/$name-$t.gguf"
  echo "== $t: $f ($(du -h "$f" | cut -f1))"
  VLM_THREADS=$THREADS /usr/bin/time -f "vlm peak RSS %M KiB" "$BUILD/bench_decoder" "$f" "$PROMPT" "$N" 2>&1 |
    grep -E "weight bytes|^decode|limit|peak RSS|error"
  /usr/bin/time -f "llama.cpp peak RSS %M KiB" node bench/llama_cpp_decode.mjs "$f" "$PROMPT" "$N" "$THREADS" 2>&1
done
