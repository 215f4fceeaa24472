#!/usr/bin/env python3
"""Benchmark (not a test): a three-turn chat about one 896x896 image, each turn sending the whole
conversation again as OpenAI clients do, timed to the first streamed token of each turn. vlm serve
with its image and prefix caches, vlm serve without them, and llama.cpp's llama-server on the same
GGUF files (its prompt cache on, as by default), one after the other; prints each turn's time to
first token and llama-server's over vlm's.

  chat_turns.py VLM_BIN MODEL.gguf MMPROJ.gguf [--llama-server BIN] [--threads 2] [--tokens 16]

llama-server comes from bench/build_llama.sh's folder (DIR/bin/llama-server).
"""
import argparse
import http.client
import json
import time

from serve_util import png_data_uri, serving


def model_id(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/v1/models")
    return json.loads(c.getresponse().read())["data"][0]["id"]


def turn(port, messages, tokens):
    """Streams one greedy turn; returns (seconds to the first content token, the answer text)."""
    body = {"model": model_id(port), "messages": messages, "max_tokens": tokens, "temperature": 0, "stream": True}
    t0 = time.time()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise SystemExit(f"port {port}: HTTP {r.status}: {r.read()[:300]!r}")
    first, text = None, ""
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        j = json.loads(line[6:])
        piece = j["choices"][0]["delta"].get("content") if j.get("choices") else None
        if piece:
            first = first if first is not None else time.time() - t0
            text += piece
    return first if first is not None else time.time() - t0, text


def chat(port, tokens):
    image = png_data_uri(896, 896)
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}},
                                             {"type": "text", "text": "What is in this picture?"}]}]
    times = []
    for follow in ["What colors does it have?", "Is anything in the corner?", None]:
        s, answer = turn(port, messages, tokens)
        times.append(s)
        if follow:
            messages = messages + [{"role": "assistant", "content": answer}, {"role": "user", "content": follow}]
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("vlm")
    ap.add_argument("model")
    ap.add_argument("mmproj")
    ap.add_argument("--llama-server")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--port", type=int, default=18093)
    a = ap.parse_args()
    runs = {}
    vlm = [a.vlm, "serve", "--model", a.model, "--mmproj", a.mmproj, "--threads", str(a.threads), "--port", "0"]
    for name, extra in [("vlm", []), ("vlm, no caches", ["--image-cache", "0", "--prefix-cache", "0"])]:
        with serving(vlm + extra) as port:
            runs[name] = chat(port, a.tokens)
    if a.llama_server:
        cmd = [a.llama_server, "-m", a.model, "--mmproj", a.mmproj, "-t", str(a.threads), "-c", "4096",
               "--parallel", "1", "-fa", "off", "--port", str(a.port), "--host", "127.0.0.1"]
        with serving(cmd) as port:
            runs["llama-server"] = chat(port, a.tokens)
    print("time to first token, s:   turn 1   turn 2   turn 3")
    for name, t in runs.items():
        print(f"  {name:22s} " + "  ".join(f"{x:7.2f}" for x in t))
    if "llama-server" in runs:
        ratios = [l / v for l, v in zip(runs["llama-server"], runs["vlm"])]
        print("llama-server / vlm:        " + "  ".join(f"{r:6.2f}x" for r in ratios))
    print("vlm without / with caches: " + "  ".join(f"{n / v:6.2f}x" for n, v in zip(runs["vlm, no caches"], runs["vlm"])))
    print("JSON " + json.dumps(runs))


if __name__ == "__main__":
    main()
