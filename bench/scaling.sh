#!/usr/bin/env bash
# vlm and llama.cpp on one GGUF file at several thread counts, in the same run: prefill and decode
# tokens/s side by side with their ratio, and how each scales from the first thread count.
#   bench/scaling.sh MODEL.gguf [THREADS="4 8 16"]
# Env: VLM_BIN (default build/vlm), LLAMA_BENCH (llama-bench; default $LLAMA_BUILD/bin/llama-bench,
# built by bench/build_llama.sh), PP (256), TG (32), BATCH (8: vlm's batched decode, 1 skips it),
# PY (python3 for the report; the standard library is enough), LOG (a file for the raw JSON lines).
# llama-bench runs as bench/llama_bench.mjs runs llama.cpp: flash attention off, f16 KV cache, the
# prompt in one batch, one repetition after its warm-up.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
model=${1:?usage: bench/scaling.sh MODEL.gguf [THREADS]}
threads=${2:-4 8 16}
vlm=${VLM_BIN:-$here/build/vlm}
llama=${LLAMA_BENCH:-${LLAMA_BUILD:?set LLAMA_BENCH or LLAMA_BUILD}/bin/llama-bench}
pp=${PP:-256} tg=${TG:-32} batch=${BATCH:-8}
py=${PY:-python3}
log=${LOG:-$(mktemp)}
: >"$log"

echo "load: $(uptime)" >&2
for t in $threads; do
  # Alternate the two programs at each thread count, so a noisy minute hits both.
  "$vlm" bench --model "$model" --threads "$t" --pp "$pp" --tg "$tg" --batch "$batch" --json | tail -n 1 |
    sed 's/^/{"tool":"vlm","row":/; s/$/}/' >>"$log"
  "$llama" -m "$model" -t "$t" -p "$pp" -n "$tg" -r 1 -fa 0 -o jsonl |
    sed 's/^/{"tool":"llama","row":/; s/$/}/' >>"$log"
done
echo "load: $(uptime)" >&2

"$py" - "$log" <<'PY'
import json, sys
vlm, llama = {}, {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["tool"] == "vlm":
        vlm[r["row"]["threads"]] = r["row"]
    else:
        t = r["row"]["n_threads"]
        key = "pp" if r["row"]["n_prompt"] else "tg"
        llama.setdefault(t, {})[key] = r["row"]["avg_ts"]
ts = sorted(vlm)
print(f"vlm ({vlm[ts[0]]['precision']}) vs llama.cpp (llama-bench, -fa 0), the same GGUF, "
      f"prefill {vlm[ts[0]]['pp']} / decode {vlm[ts[0]]['tg']} tokens:")
print(f"{'threads':>7} | {'prefill vlm':>11} {'llama':>8} {'ratio':>6} | {'decode vlm':>10} {'llama':>7} {'ratio':>6} "
      f"{'roofline':>8} | {'batched x' + str(vlm[ts[0]]['batch']):>11} {'vs b1':>6} | {'peak GFLOP/s':>12}")
for t in ts:
    v, l = vlm[t], llama.get(t, {})
    pr = v["pp_tok_s"] / l["pp"] if "pp" in l else float("nan")
    tr = v["tg_tok_s"] / l["tg"] if "tg" in l else float("nan")
    print(f"{t:>7} | {v['pp_tok_s']:>11.2f} {l.get('pp', float('nan')):>8.2f} {pr:>5.2f}x | "
          f"{v['tg_tok_s']:>10.3f} {l.get('tg', float('nan')):>7.3f} {tr:>5.2f}x "
          f"{100 * v['tg_fraction_of_roofline']:>7.1f}% | {v['batch_tok_s']:>11.3f} {v['batch_speedup']:>5.2f}x | "
          f"{v['peak_gflops']:>12.1f}")
if len(ts) > 1:
    a, b = ts[0], ts[-1]
    def scale(x, y):
        return f"{y / x:.2f}x ({100 * y / x / (b / a):.0f}% of linear)"
    print(f"{a} -> {b} threads: prefill vlm {scale(vlm[a]['pp_tok_s'], vlm[b]['pp_tok_s'])}, "
          f"llama.cpp {scale(llama[a]['pp'], llama[b]['pp'])}; decode vlm {scale(vlm[a]['tg_tok_s'], vlm[b]['tg_tok_s'])}, "
          f"llama.cpp {scale(llama[a]['tg'], llama[b]['tg'])}")
    # What the machine allows: on a VM whose threads share cores, the FMA peak stops growing
    # before the thread count does, and prefill, at 85-90 % of it, with it.
    print(f"the machine's limits, {a} -> {b} threads: FMA peak (vlm bench's probe) "
          f"{scale(vlm[a]['peak_gflops'], vlm[b]['peak_gflops'])}, read bandwidth "
          f"{scale(vlm[a]['read_gb_s'], vlm[b]['read_gb_s'])}")
PY
