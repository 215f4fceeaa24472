#!/usr/bin/env bash
# Builds llama.cpp's multimodal CLI and its libraries (llama-mtmd-cli, libmtmd, libllama) in DIR
# from the source node-llama-cpp bundles (tools/npm): about 15 minutes on 2 cores; nothing to do
# when DIR holds the build already. bench/peer.sh (MTMD_BUILD=DIR) times an image with it, and
# tests/e2e/test_mtmd.py (VLM_MTMD_BUILD=DIR) compares its logits with vlm's.
#   bench/build_mtmd.sh DIR [THREADS=nproc]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:?usage: bench/build_mtmd.sh DIR [THREADS]}
threads=${2:-$(nproc)}
[ -x "$dir/bin/llama-mtmd-cli" ] && exit 0
bundle=$here/tools/npm/node_modules/node-llama-cpp/llama/gitRelease.bundle
[ -s "$bundle" ] || { echo "build_mtmd.sh: $bundle missing (npm install in tools/npm)" >&2; exit 2; }
[ -d "$dir/src" ] || git clone -q "$bundle" "$dir/src"
cmake -S "$dir/src" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON >/dev/null
cmake --build "$dir" -j"$threads" --target llama-mtmd-cli >/dev/null
