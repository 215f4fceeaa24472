#!/usr/bin/env python3
"""Benchmark (not a test): decode speed with drafts by prompt lookup (`vlm serve --draft K`) and
without, and llama.cpp's llama-server without and with its own (`--spec-type ngram-simple`), on
the same model and the same greedy request, one server after the other. The answer is streamed;
its decode rate is (completion tokens - 1) over the time from its first token to its end. Prints
each rate and the ratios with drafts over without, and vlm's over llama-server's.

A random-weight checkpoint's greedy answer repeats one token, so nearly every draft id is taken:
this is the best case for both programs. `vlm bench --draft K` prints what a step that checks K
ids costs against a plain one, which bounds the worst case.

  drafts.py VLM_BIN MODEL [--draft 4] [--llama-server BIN] [--threads 2] [--tokens 128]

MODEL is what `vlm serve --model` takes (a checkpoint folder or a GGUF); llama-server needs a GGUF.
"""
import argparse
import json

from bench_serve import stream
from chat_turns import model_id
from serve_util import serving

PROMPT = ("Copy this list exactly, one item a line: apples, pears, plums, cherries, grapes, lemons, limes, "
          "oranges, apricots, peaches, figs, dates.")


def decode_rate(port, tokens):
    """Streams one greedy answer of `tokens` tokens; returns (tokens/s after the first, tokens)."""
    body = {"model": model_id(port), "messages": [{"role": "user", "content": PROMPT}], "max_tokens": tokens,
            "temperature": 0, "ignore_eos": True}
    out = []
    stream(port, body, out)
    r = out[0]
    if not r["tokens"] or r["ttft"] is None:
        raise SystemExit(f"port {port}: no answer streamed")
    return (r["tokens"] - 1) / (r["seconds"] - r["ttft"]), r["tokens"]


def run(cmd, tokens):
    with serving(cmd) as port:
        decode_rate(port, 8)  # pages the weights in
        return decode_rate(port, tokens)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("vlm")
    ap.add_argument("model")
    ap.add_argument("--draft", type=int, default=4)
    ap.add_argument("--llama-server")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--port", type=int, default=18095)
    a = ap.parse_args()
    runs = {}
    vlm = [a.vlm, "serve", "--model", a.model, "--threads", str(a.threads), "--port", "0"]
    runs["vlm"] = run(vlm, a.tokens)
    runs[f"vlm --draft {a.draft}"] = run(vlm + ["--draft", str(a.draft)], a.tokens)
    if a.llama_server:
        llama = [a.llama_server, "-m", a.model, "-t", str(a.threads), "-c", "4096", "--parallel", "1", "-fa", "off",
                 "--port", str(a.port), "--host", "127.0.0.1"]
        runs["llama-server"] = run(llama, a.tokens)
        runs["llama-server ngram-simple"] = run(llama + ["--spec-type", "ngram-simple"], a.tokens)
    print("decode after the first token:  tok/s   tokens")
    for name, (rate, n) in runs.items():
        print(f"  {name:28s} {rate:7.2f}  {n:5d}")
    vlm_d = runs[f"vlm --draft {a.draft}"][0]
    print(f"vlm with drafts / without: {vlm_d / runs['vlm'][0]:.2f}x")
    if a.llama_server:
        llama_d = runs["llama-server ngram-simple"][0]
        print(f"llama-server with ngram-simple / without: {llama_d / runs['llama-server'][0]:.2f}x")
        print(f"vlm with drafts / llama-server with ngram-simple: {vlm_d / llama_d:.2f}x")
    print("JSON " + json.dumps(runs))


if __name__ == "__main__":
    main()
