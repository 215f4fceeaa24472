#!/usr/bin/env python3
"""Benchmark (not a test): a long chat whose last message is edited and sent again, as chat
front-ends do (the conversation up to that message is unchanged). Times to the first streamed
token of the first request and of the edited one, for each server given: vlm serve, a second vlm
binary (an older build, say), llama.cpp's llama-server on the same GGUF (its prompt cache on, as
by default); prints the edited request's time over the first's.

  edited_message.py VLM_BIN MODEL [--other-vlm BIN] [--llama-server BIN] [--threads 2]
                    [--history 1400] [--last 200]

MODEL is what `vlm serve --model` takes (a checkpoint folder or a GGUF); llama-server needs a GGUF.
"""
import argparse
import json

from chat_turns import turn
from serve_util import serving


def words(n, seed):
    """About n tokens of plain English-like filler (14 tokens a sentence), different for each seed."""
    out = []
    for i in range(max(1, n // 14)):
        out.append(f"Item {seed}-{i} of the list is a small {['red', 'blue', 'green'][i % 3]} box.")
    return " ".join(out)


def conversation(history, last, edit):
    messages = []
    for k in range(4):  # four earlier exchanges of about history/4 tokens each
        messages += [{"role": "user", "content": words(history // 8, k)},
                     {"role": "assistant", "content": words(history // 8, 100 + k)}]
    opening = "Please say more about it." if edit else "Tell me more about that."
    return messages + [{"role": "user", "content": opening + " " + words(last, 999)}]


def run(cmd, a):
    with serving(cmd) as port:
        first, _ = turn(port, conversation(a.history, a.last, False), 2)
        edited, _ = turn(port, conversation(a.history, a.last, True), 2)
        return first, edited


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("vlm")
    ap.add_argument("model")
    ap.add_argument("--other-vlm")
    ap.add_argument("--llama-server")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--history", type=int, default=1400)
    ap.add_argument("--last", type=int, default=200)
    ap.add_argument("--port", type=int, default=18094)
    a = ap.parse_args()
    runs = {}
    for name, binary in [("vlm", a.vlm), ("other vlm", a.other_vlm)]:
        if binary:
            runs[name] = run([binary, "serve", "--model", a.model, "--threads", str(a.threads), "--port", "0"], a)
    if a.llama_server:
        runs["llama-server"] = run([a.llama_server, "-m", a.model, "-t", str(a.threads), "-c", "8192", "--parallel",
                                    "1", "-fa", "off", "--port", str(a.port), "--host", "127.0.0.1"], a)
    print("time to first token, s:   first   edited   first / edited")
    for name, (f, e) in runs.items():
        print(f"  {name:22s} {f:7.2f}  {e:7.2f}  {f / e:7.2f}x")
    print("JSON " + json.dumps(runs))


if __name__ == "__main__":
    main()
