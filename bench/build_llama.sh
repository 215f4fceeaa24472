#!/usr/bin/env bash
# Builds the llama.cpp tools the benchmarks and tests compare against (llama-mtmd-cli with libmtmd and
# libllama, llama-batched-bench, llama-bench and llama-server) in DIR from the source node-llama-cpp bundles (tools/npm):
# about 15 minutes on 2 cores; nothing to do when DIR holds them already. With LLAMA_BUILD=DIR,
# bench/peer.sh times an image and batched decode with them and bench/bench_gguf.sh batched
# decode; bench/chat_turns.py --llama-server DIR/bin/llama-server times a chat's turns; tests/e2e/test_mtmd.py
# (VLM_MTMD_BUILD=DIR) compares libmtmd's logits with vlm's.
#   bench/build_llama.sh DIR [THREADS=nproc]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:?usage: bench/build_llama.sh DIR [THREADS]}
threads=${2:-$(nproc)}
[ -x "$dir/bin/llama-mtmd-cli" ] && [ -x "$dir/bin/llama-batched-bench" ] && [ -x "$dir/bin/llama-bench" ] &&
  [ -x "$dir/bin/llama-server" ] && exit 0
bundle=$here/tools/npm/node_modules/node-llama-cpp/llama/gitRelease.bundle
[ -s "$bundle" ] || { echo "build_llama.sh: $bundle missing (npm install in tools/npm)" >&2; exit 2; }
[ -d "$dir/src" ] || git clone -q "$bundle" "$dir/src"
cmake -S "$dir/src" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON >/dev/null
cmake --build "$dir" -j"$threads" --target llama-mtmd-cli llama-batched-bench llama-bench llama-server >/dev/null
