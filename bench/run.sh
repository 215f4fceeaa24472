#!/usr/bin/env bash
# Runs every benchmark and prints their ratios (to the measured memory bandwidth and
# FMA peak of this machine, and to the npm tokenizer). Makes the gemma3-4b-shaped
# random checkpoint (8.6 GB, a few minutes) the first time, in build/ckpt/gemma3-4b.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
CKPT=${VLM_BENCH_MODEL:-build/ckpt/gemma3-4b}
if [ ! -f "$CKPT/.stamp" ]; then  # .stamp: written once the folder is complete
  /usr/bin/python3 tools/make_checkpoint.py --preset gemma3-4b --out "$CKPT" --shards 2 --naming old
  touch "$CKPT/.stamp"
fi
export VLM_THREADS=${VLM_THREADS:-2}
echo "== kernels";   build/bench_kernels --quick
echo "== tokenizer"; build/bench_tokenizer
echo "== drafts";    build/bench_drafts
echo "== vision";    build/bench_vision "$CKPT"
echo "== decoder";   build/bench_decoder "$CKPT"
