#!/usr/bin/env python3
"""Benchmark of `vlm serve` (not a test): aggregate generated tokens/s at 1, 4 and 16 concurrent
greedy streams, and the time to first token of a text request sent while an image request is
being encoded (it must not wait for the whole image: the scheduler encodes images as their own
unit of work between decode steps).

  bench_serve.py VLM_BIN MODEL_DIR [--threads N] [--tokens N]
"""
import argparse
import http.client
import json
import threading
import time

from serve_util import png_data_uri, serving


def stream(port, body, out):
    """POSTs a streamed chat request; records the time of the first content chunk and the count."""
    t0 = time.time()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    c.request("POST", "/v1/chat/completions", json.dumps(dict(body, stream=True,
                                                               stream_options={"include_usage": True})),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    first, tokens = None, 0
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        j = json.loads(line[6:])
        if j.get("usage"):
            tokens = j["usage"]["completion_tokens"]
        if j["choices"] and j["choices"][0]["delta"].get("content") and first is None:
            first = time.time() - t0
    out.append({"ttft": first, "tokens": tokens, "seconds": time.time() - t0})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=16)
    a = ap.parse_args()
    with serving([a.bin, "serve", "--model", a.model, "--port", "0", "--threads", str(a.threads),
                  "--max-seqs", "16"]) as port:
        text = {"messages": [{"role": "user", "content": "Write a story about a lighthouse."}],
                "max_tokens": a.tokens, "temperature": 0, "ignore_eos": True}
        for n in (1, 4, 16):
            out = []
            threads = [threading.Thread(target=stream, args=(port, text, out)) for _ in range(n)]
            t0 = time.time()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.time() - t0
            toks = sum(o["tokens"] for o in out)
            print(f"{n:2d} concurrent streams: {toks / wall:7.2f} generated tokens/s aggregate "
                  f"({toks} tokens in {wall:.1f} s; mean time to first token {sum(o['ttft'] for o in out) / n:.2f} s)")

        alone = []
        stream(port, dict(text, max_tokens=4), alone)
        print(f"text request alone: time to first token {alone[0]['ttft']:.2f} s")
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        c.request("GET", "/v1/models")
        if not json.loads(c.getresponse().read())["data"][0]["capabilities"]["vision"]:
            print("no vision tower: no image request")
            return
        image = {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": png_data_uri(896, 896)}},
            {"type": "text", "text": "Describe this."}]}], "max_tokens": 4, "temperature": 0}
        img_out, txt_out = [], []
        ti = threading.Thread(target=stream, args=(port, image, img_out))
        ti.start()
        time.sleep(0.3)  # the image request is admitted and its encode has started
        stream(port, dict(text, max_tokens=4), txt_out)
        ti.join()
        print(f"text request sent while an image is encoded: time to first token {txt_out[0]['ttft']:.2f} s "
              f"(the image request's own first token: {img_out[0]['ttft']:.2f} s)")


if __name__ == "__main__":
    main()
