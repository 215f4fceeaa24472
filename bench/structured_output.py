#!/usr/bin/python3
"""What a response_format costs per generated token: one `vlm serve`, streamed requests with and
without a JSON Schema, alternating, sampled (temperature 1: every token pays for the full mask,
greedy would ask about the argmax only). Prints the median time a token of each (after the
first, so without the prefill) and their ratio.

    /usr/bin/python3 bench/structured_output.py build/vlm MODEL [--threads 2] [--runs 3] [--tokens 48]
"""
import argparse
import http.client
import json
import statistics
import time

from serve_util import serving

SCHEMA = {"type": "object", "properties": {
    "caption": {"type": "string"}, "objects": {"type": "array", "items": {"type": "string"}},
    "count": {"type": "integer"}, "outdoor": {"type": "boolean"}},
    "required": ["caption", "objects", "count", "outdoor"]}


def per_token(port, body):
    """Seconds per generated token after the first streamed one (the prompt's prefill excluded)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.read()
    arrivals, buf = [], b""  # (time, ids in the chunk)
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            data = event[len(b"data: "):]
            if data == b"[DONE]":
                continue
            j = json.loads(data)
            ids = j["choices"][0].get("token_ids", []) if j.get("choices") else []
            if ids:
                arrivals.append((time.perf_counter(), len(ids)))
    c.close()
    later = sum(n for _, n in arrivals[1:])
    return (arrivals[-1][0] - arrivals[0][0]) / later, later


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("vlm")
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=48)
    a = ap.parse_args()
    with serving([a.vlm, "serve", "--model", a.model, "--port", "0", "--threads", str(a.threads),
                  "--prefix-cache", "0"]) as port:
        times = {"free": [], "schema": []}
        for run in range(a.runs):
            for kind in ("free", "schema"):
                body = {"messages": [{"role": "user", "content": f"Describe a street scene ({run})."}],
                        "max_tokens": a.tokens, "temperature": 1, "seed": run, "stream": True,
                        "ignore_eos": True, "return_token_ids": True}
                if kind == "schema":
                    body["response_format"] = {"type": "json_schema", "json_schema": {"name": "scene", "schema": SCHEMA}}
                t, n = per_token(port, body)
                times[kind].append(t)
                print(f"run {run} {kind}: {t * 1e3:.2f} ms a token ({n} tokens)", flush=True)
        free, schema = statistics.median(times["free"]), statistics.median(times["schema"])
        print(f"median time a token: free {free * 1e3:.2f} ms, with a JSON Schema {schema * 1e3:.2f} ms; "
              f"ratio {schema / free:.3f}")


if __name__ == "__main__":
    main()
