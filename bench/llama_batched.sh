#!/usr/bin/env bash
# llama.cpp's batched decode on a GGUF file, measured as `vlm bench --batch B` measures ours: B
# sequences with two-token prompts decoding STEPS tokens each in one llama_decode per step
# (llama-batched-bench from bench/build_llama.sh, flash attention off as in bench/llama_bench.mjs).
# Prints one JSON object: batch_tok_s (aggregate over the B sequences) and batch1_tok_s (one
# sequence, the same tool and steps).
#   bench/llama_batched.sh LLAMA_BUILD MODEL.gguf THREADS STEPS B
set -euo pipefail
build=${1:?usage: bench/llama_batched.sh LLAMA_BUILD MODEL.gguf THREADS STEPS B}
model=${2:?} threads=${3:?} steps=${4:?} b=${5:?}
ctx=$(( (b + 1) * (steps + 8) ))
"$build/bin/llama-batched-bench" -m "$model" -t "$threads" -c "$ctx" -b 512 -ub 512 -fa off \
  -npp 2 -ntg "$steps" -npl "1,$b" --output-format jsonl 2>&1 |
  /usr/bin/python3 -c '
import json, sys
runs = {r["pl"]: r for r in map(json.loads, (l for l in sys.stdin if l.startswith("{") and "speed_tg" in l))}
b = int(sys.argv[1])
print(json.dumps({"batch": b, "batch_tok_s": runs[b]["speed_tg"], "batch1_tok_s": runs[1]["speed_tg"]}))' "$b"
