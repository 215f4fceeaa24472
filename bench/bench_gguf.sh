#!/usr/bin/env bash
# vlm next to llama.cpp on the same GGUF files of one checkpoint, BF16 / Q8_0 / Q4_K_M / Q4_0, in one
# run: prefill and decode tokens/s of each (`vlm bench` and bench/llama_bench.mjs, measured the
# same way), the ratio, vlm's fraction of the bandwidth roofline, and both peak RSS. The files are
# made once into OUT_DIR (bf16 by tools/convert_hf_to_gguf.py, which streams tensor by tensor;
# the others by `vlm quantize`). Run it on a quiet machine: decode is memory-bound.
# With ROUNDS > 1 the pairs run again in turn (vlm, llama.cpp, next type, ...), and a summary
# gives each type's ratios as median and range over the rounds: on a VM whose speed drifts
# within minutes, a ratio from one pair can be off by a third.
# With BATCH > 1, also BATCH sequences decoding together (`vlm bench --batch`), and with LLAMA_BUILD
# (a folder bench/build_llama.sh builds, first if needed) llama.cpp's llama-batched-bench on the
# same file and steps (bench/llama_batched.sh).
# Usage: bench/bench_gguf.sh [CKPT_DIR] [OUT_DIR] [TYPES...]
#   defaults /work/ckpt/gemma3-4b, /work/ckpt/gguf, "bf16 q8_0 q4_k_m q4_0"
#   env: THREADS (2), PP (64), TG (32), ROUNDS (1), BATCH (1), LLAMA_BUILD, VLM_BIN (build/vlm)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
ckpt=${1:-/work/ckpt/gemma3-4b}
out=${2:-/work/ckpt/gguf}
shift $(( $# < 2 ? $# : 2 ))
types=${*:-bf16 q8_0 q4_k_m q4_0}
threads=${THREADS:-2} pp=${PP:-64} tg=${TG:-32} rounds=${ROUNDS:-1} batch=${BATCH:-1}
vlm=${VLM_BIN:-$here/build/vlm}
py=/usr/bin/python3
mkdir -p "$out"
case "$(cd "$out" && pwd)/" in "$here"/*) echo "bench_gguf.sh: OUT_DIR must be outside the repository" >&2; exit 2;; esac
name=$(basename "$(cd "$ckpt" && pwd)")
for t in $types; do
  f=$out/$name-$t.gguf
  [ -s "$f" ] && continue
  if [ "$t" = bf16 ]; then
    "$py" "$here/tools/convert_hf_to_gguf.py" "$ckpt" --out "$f.tmp" --type bf16
  else
    "$vlm" quantize --model "$ckpt" --type "$t" --out "$f.tmp"
  fi
  mv "$f.tmp" "$f"
done
peer_batch=0
if [ "$batch" -gt 1 ] && [ -n "${LLAMA_BUILD:-}" ]; then
  bash "$here/bench/build_llama.sh" "$LLAMA_BUILD" "$threads"
  peer_batch=1
fi
results=$(mktemp)
trap 'rm -f "$results"' EXIT
echo "load: $(uptime)"
for round in $(seq "$rounds"); do
  for t in $types; do
    f=$out/$name-$t.gguf
    ours=$("$vlm" bench --model "$f" --threads "$threads" --pp "$pp" --tg "$tg" --batch "$batch" --json 2>/dev/null | tail -n 1)
    peer=$( { /usr/bin/time -f '{"rss_kib": %M}' node "$here/bench/llama_bench.mjs" "$f" "$threads" "$pp" "$tg"; } 2>&1 |
      grep '^{' | "$py" -c "import json,sys; d={}; [d.update(json.loads(l)) for l in sys.stdin]; print(json.dumps(d))")
    batched=null
    [ "$peer_batch" = 1 ] && batched=$(bash "$here/bench/llama_batched.sh" "$LLAMA_BUILD" "$f" "$threads" \
      "$("$py" -c "import json,sys; print(json.loads(sys.argv[1])['batch_steps'])" "$ours")" "$batch")
    "$py" - "$t" "$f" "$ours" "$peer" "$round" "$batched" <<'PY' | tee -a "$results"
import json, os, sys
t, f, ours, peer, rnd = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4]), sys.argv[5]
batched = json.loads(sys.argv[6])
if batched:
    peer.update(batched)
print(f"{t} ({os.path.getsize(f) / 1e9:.2f} GB file), round {rnd}, {ours['threads']} threads, vlm precision {ours['precision']}:")
print(f"  prefill {ours['pp']}: vlm {ours['pp_tok_s']:.2f} vs llama.cpp {peer['pp_tok_s']:.2f} tok/s"
      f" = {ours['pp_tok_s'] / peer['pp_tok_s']:.2f}x")
print(f"  decode {ours['tg']}: vlm {ours['tg_tok_s']:.3f} vs llama.cpp {peer['tg_tok_s']:.3f} tok/s"
      f" = {ours['tg_tok_s'] / peer['tg_tok_s']:.2f}x; roofline {ours['roofline_tg_tok_s']:.3f} tok/s"
      f" ({ours['read_gb_s']:.1f} GB/s): vlm {100 * ours['tg_fraction_of_roofline']:.0f}%,"
      f" llama.cpp {100 * peer['tg_tok_s'] / ours['roofline_tg_tok_s']:.0f}%")
if ours["batch"] > 1:
    line = f"  batched decode x{ours['batch']}: vlm {ours['batch_tok_s']:.3f} tok/s ({ours['batch_speedup']:.2f}x its batch 1)"
    if batched:
        line += (f" vs llama.cpp {peer['batch_tok_s']:.3f} tok/s ({peer['batch_tok_s'] / peer['batch1_tok_s']:.2f}x its batch 1"
                 f" in llama-batched-bench) = {ours['batch_tok_s'] / peer['batch_tok_s']:.2f}x")
    print(line)
print(f"  peak RSS: vlm {ours['rss_bytes'] / 1e9:.2f} GB, llama.cpp {peer['rss_kib'] * 1024 / 1e9:.2f} GB")
print(json.dumps({"type": t, "round": int(rnd), "vlm": ours, "llama_cpp": peer}))
PY
  done
done
echo "load: $(uptime)"
[ "$rounds" -gt 1 ] && "$py" - "$results" <<'PY'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        runs.setdefault(r["type"], []).append(r)
print(f"ratios vlm / llama.cpp over {max(len(v) for v in runs.values())} alternating rounds: median (min-max)")
for t, rs in runs.items():
    def show(key):
        q = [r["vlm"][key] / r["llama_cpp"][key] for r in rs]
        return f"{statistics.median(q):.2f}x ({min(q):.2f}-{max(q):.2f})"
    batched = f", batched x{rs[0]['vlm']['batch']} {show('batch_tok_s')}" if "batch_tok_s" in rs[0]["llama_cpp"] else ""
    print(f"  {t}: prefill {show('pp_tok_s')}, decode {show('tg_tok_s')}{batched}")
PY
exit 0
