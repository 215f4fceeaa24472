#!/usr/bin/env bash
# vlm next to llama.cpp on the same weights, in the same run, with the ratios.
#   bench/peer.sh CHECKPOINT_DIR [THREADS=2]
# Env: VLM_BIN (default build/vlm), PP (512), TG (128), BATCH (8), GGUF_DIR (/work/ckpt: where
# the converted GGUFs are kept — never inside the repository), PRECISION (vlm's --precision;
# default: the checkpoint's), LLAMA_BUILD (a folder of llama.cpp tools, built there first with
# bench/build_llama.sh: when set, the image is timed with llama-mtmd-cli and batched decode with
# llama-batched-bench too, bench/llama_batched.sh).
# Text: llama.cpp through node-llama-cpp's prebuilt CPU binary (bench/llama_bench.mjs), on a
# bf16 GGUF written by tools/convert_hf_to_gguf.py; vlm runs on the same GGUF (and mmproj).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
ckpt=${1:?usage: bench/peer.sh CHECKPOINT_DIR [THREADS]}
threads=${2:-2}
vlm=${VLM_BIN:-$here/build/vlm}
pp=${PP:-512} tg=${TG:-128} batch=${BATCH:-8}
gguf_dir=${GGUF_DIR:-/work/ckpt}
py=/usr/bin/python3
name=$(basename "$(cd "$ckpt" && pwd)")
gguf=$gguf_dir/$name-bf16.gguf
mmproj=$gguf_dir/$name-mmproj-bf16.gguf
case "$(cd "$gguf_dir" && pwd)/" in "$here"/*) echo "peer.sh: GGUF_DIR must be outside the repository" >&2; exit 2;; esac

if [ ! -s "$gguf" ] || { [ -n "${LLAMA_BUILD:-}" ] && [ ! -s "$mmproj" ]; }; then
  echo "converting $ckpt -> $gguf" >&2
  extra=()
  [ -n "${LLAMA_BUILD:-}" ] && extra=(--mmproj-out "$mmproj" --mmproj-type bf16)
  "$py" "$here/tools/convert_hf_to_gguf.py" "$ckpt" --out "$gguf.tmp" --type bf16 "${extra[@]}"
  mv "$gguf.tmp" "$gguf"
fi

echo "load: $(uptime)" >&2
prec=()
[ -n "${PRECISION:-}" ] && prec=(--precision "$PRECISION")
img=()
[ -n "${LLAMA_BUILD:-}" ] && img=(--image)
# vlm reads the same GGUF files as llama.cpp: the same bytes in the same page-cache pages. Where the
# page cache put a file changes how fast it streams on this VM (docs/gguf.md, "Decode streams").
mm=()
[ -n "${LLAMA_BUILD:-}" ] && mm=(--mmproj "$mmproj")
ours=$("$vlm" bench --model "$gguf" "${mm[@]}" --threads "$threads" --pp "$pp" --tg "$tg" --batch "$batch" --json \
  "${prec[@]}" "${img[@]}" | tail -n 1)
peer=$(node "$here/bench/llama_bench.mjs" "$gguf" "$threads" "$pp" "$tg" | tail -n 1)

peer_img=null peer_batch=null
if [ -n "${LLAMA_BUILD:-}" ]; then
  bash "$here/bench/build_llama.sh" "$LLAMA_BUILD" "$threads"
  peer_batch=$(bash "$here/bench/llama_batched.sh" "$LLAMA_BUILD" "$gguf" "$threads" \
    "$("$py" -c "import json,sys; print(json.loads(sys.argv[1])['batch_steps'])" "$ours")" "$batch")
  cli=$LLAMA_BUILD/bin/llama-mtmd-cli
  size=$("$py" -c "import json,sys; print(json.load(open(sys.argv[1]))['vision_config']['image_size'])" "$ckpt/config.json")
  png=$gguf_dir/peer-$size.png
  "$py" -c "
import sys, numpy as np
from PIL import Image
s = int(sys.argv[2])
Image.fromarray((np.random.default_rng(0).random((s, s, 3)) * 255).astype(np.uint8)).save(sys.argv[1])" "$png" "$size"
  # Flash attention off: its fastest CPU setting for the vision tower (measured 2026-12-01, 2 threads:
  # 79 s off, 262 s with the default "auto").
  log=$("$cli" -m "$gguf" --mmproj "$mmproj" --image "$png" -p "Describe." -n 1 -t "$threads" --temp 0 -fa off 2>&1 ||
    true)
  # "image slice encoded in N ms" (older builds) or "mtmd batch encoding done in N ms"
  ms=$(printf '%s\n' "$log" | sed -n 's/.*\(image slice encoded\|batch encoding done\) in \([0-9.]*\) ms.*/\2/p' | head -n 1)
  [ -n "$ms" ] && peer_img=$(awk "BEGIN{print $ms/1000}")
fi
echo "load: $(uptime)" >&2

"$py" - "$ours" "$peer" "$peer_img" "$peer_batch" <<'PY'
import json, sys
ours, peer = json.loads(sys.argv[1]), json.loads(sys.argv[2])
peer_img, peer_batch = json.loads(sys.argv[3]), json.loads(sys.argv[4])
print(f"vlm ({ours['precision']}, {ours['threads']} threads) vs llama.cpp (node-llama-cpp, bf16 GGUF), same weights:")
print(f"  prefill {ours['pp']}: {ours['pp_tok_s']:.2f} vs {peer['pp_tok_s']:.2f} tok/s = {ours['pp_tok_s'] / peer['pp_tok_s']:.2f}x"
      f"  (vlm at {100 * ours['pp_fraction_of_peak']:.1f}% of the {ours['peak_gflops']:.0f} GFLOP/s peak)")
print(f"  decode {ours['tg']}: {ours['tg_tok_s']:.3f} vs {peer['tg_tok_s']:.3f} tok/s = {ours['tg_tok_s'] / peer['tg_tok_s']:.2f}x"
      f"  (roofline {ours['roofline_tg_tok_s']:.3f} tok/s from {ours['read_gb_s']:.2f} GB/s: vlm at"
      f" {100 * ours['tg_fraction_of_roofline']:.1f}%, llama.cpp at {100 * peer['tg_tok_s'] / ours['roofline_tg_tok_s']:.1f}%)")
line = f"  batched decode x{ours['batch']}: {ours['batch_tok_s']:.3f} tok/s = {ours['batch_speedup']:.2f}x vlm batch 1"
if peer_batch:
    line += (f"; llama.cpp {peer_batch['batch_tok_s']:.3f} tok/s ({peer_batch['batch_tok_s'] / peer_batch['batch1_tok_s']:.2f}x"
             f" its batch 1 in llama-batched-bench): {ours['batch_tok_s'] / peer_batch['batch_tok_s']:.2f}x")
print(line)
if ours.get("image_s") and peer_img:
    print(f"  image: {ours['image_s']:.2f} vs {peer_img:.2f} s = {peer_img / ours['image_s']:.2f}x")
print(f"  peak RSS {ours['rss_bytes'] / 1e9:.2f} GB")
print(json.dumps({"vlm": ours, "llama_cpp": peer, "llama_cpp_image_s": peer_img, "llama_cpp_batched": peer_batch}))
PY
