#!/usr/bin/python3
"""Several questions about one image in one `vlm batch` run, as a batch job asks them: the time with
the prefix cache (running requests take the image block's rows the first one computed) over the
time with `--prefix-cache 0` (each request prefills the block itself). The image cache is on in
both, so the image is encoded once either way.

    /usr/bin/python3 bench/shared_prefix.py build/vlm MODEL IMAGE [--questions 4] [--threads 2]
"""
import argparse
import json
import os
import subprocess
import tempfile
import time

QUESTIONS = ["What is in this picture?", "What colours dominate this picture?", "Is this photo taken indoors?",
             "How many people can you see?", "Describe the lighting.", "What is in the background?",
             "Write a caption for this image.", "What season is it?"]


def run(vlm, model, requests, threads, extra):
    with tempfile.TemporaryDirectory() as d:
        src, out = os.path.join(d, "in.jsonl"), os.path.join(d, "out.jsonl")
        with open(src, "w") as f:
            for r in requests:
                f.write(json.dumps(r) + "\n")
        t = time.perf_counter()
        subprocess.run([vlm, "batch", "--model", model, "--input", src, "--output", out, "--threads", str(threads),
                        "--max-seqs", str(len(requests)), *extra], check=True, capture_output=True)
        elapsed = time.perf_counter() - t
        with open(out) as f:
            lines = [json.loads(line) for line in f]
    usage = [line["response"]["body"]["usage"] for line in lines]
    return elapsed, sum(u["prompt_tokens_details"]["cached_tokens"] for u in usage), sum(u["prompt_tokens"] for u in usage)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("vlm")
    ap.add_argument("model")
    ap.add_argument("image")
    ap.add_argument("--questions", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    requests = [{"custom_id": f"q{i}", "body": {
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": os.path.abspath(a.image)}},
                                                  {"type": "text", "text": QUESTIONS[i % len(QUESTIONS)]}]}],
        "max_tokens": 8, "temperature": 0}} for i in range(a.questions)]
    shared, cached, prompt = run(a.vlm, a.model, requests, a.threads, [])
    alone, cached0, _ = run(a.vlm, a.model, requests, a.threads, ["--prefix-cache", "0"])
    print(f"{a.questions} questions about one image: {shared:.1f} s sharing the prefix ({cached} of {prompt} prompt "
          f"tokens taken), {alone:.1f} s with --prefix-cache 0 ({cached0} taken); ratio {alone / shared:.2f}x")


if __name__ == "__main__":
    main()
