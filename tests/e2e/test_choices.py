"""Several choices in one request (`n`) and lists of prompts on /v1/completions, through the real
server and the official `openai` client: choice j of a seeded request is exactly what the same
request with n = 1 and seed + j gives alone (vLLM's parallel sampling), the prompt is computed
once and its image encoded once, usage counts the prompt once and every choice's tokens, streams
carry each choice's role, deltas and finish under its index, and a client that leaves cancels
every choice."""
import json
import os
import subprocess
import tempfile
import time
import unittest

from server_util import BIN, FIXTURES, Server, chat, metric, openai_client, windowed_copy


def stream_choices(chunks):
    """Per index: role chunks, content, token ids, finish reasons, from a stream's chunks."""
    out = {}
    for c in chunks:
        for ch in c["choices"]:
            o = out.setdefault(ch["index"], {"roles": 0, "text": "", "ids": [], "finish": []})
            delta = ch.get("delta", {})
            o["roles"] += "role" in delta
            o["text"] += delta.get("content") or ch.get("text") or ""
            o["ids"] += ch.get("token_ids") or []
            if ch.get("finish_reason"):
                o["finish"].append(ch["finish_reason"])
    return out


@unittest.skipUnless(BIN and FIXTURES, "VLM_BIN and VLM_FIXTURES must be set")
class TestChoices(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.srv = Server(windowed_copy(cls.tmp.name), ["--max-seqs", "8"], threads=2)

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()
        cls.tmp.cleanup()

    def post(self, path, body):
        code, _, r = self.srv.post(path, body)
        self.assertEqual(code, 200, r)
        return r

    def test_chat_choices_are_the_seeded_solo_answers(self):
        for images in ([], [41]):
            with self.subTest(images=images):
                req = chat("Tell me a story", image_seeds=images, max_tokens=10, temperature=1.0, seed=77,
                           logprobs=True, top_logprobs=2)
                solo = [self.post("/v1/chat/completions", dict(req, seed=77 + j)) for j in range(4)]
                self.assertGreater(len({tuple(s["choices"][0]["token_ids"]) for s in solo}), 1,
                                   "sampled with different seeds, the answers should differ")
                before = self.srv.metrics()
                r = self.post("/v1/chat/completions", dict(req, n=4))
                m = self.srv.metrics()
                self.assertEqual([c["index"] for c in r["choices"]], [0, 1, 2, 3])
                for j, c in enumerate(r["choices"]):
                    want = solo[j]["choices"][0]
                    self.assertEqual(c["token_ids"], want["token_ids"], f"choice {j}")
                    self.assertEqual(c["message"]["content"], want["message"]["content"])
                    self.assertEqual(c["finish_reason"], want["finish_reason"])
                    self.assertEqual([t["token"] for t in c["logprobs"]["content"]],
                                     [t["token"] for t in want["logprobs"]["content"]])
                # The prompt counted once, every choice's tokens.
                prompt = solo[0]["usage"]["prompt_tokens"]
                self.assertEqual(r["usage"]["prompt_tokens"], prompt)
                self.assertEqual(r["usage"]["completion_tokens"], sum(s["usage"]["completion_tokens"] for s in solo))
                self.assertEqual(r["usage"]["total_tokens"], prompt + r["usage"]["completion_tokens"])
                self.assertEqual(r["usage"]["prompt_tokens_details"]["image_tokens"],
                                 solo[0]["usage"]["prompt_tokens_details"]["image_tokens"])

                def grew(name):
                    return metric(m, name, 0) - metric(before, name, 0)
                # Nothing computed: the solo runs left this prompt in the prefix cache where their
                # prefill ended, logits and all, and every choice starts from it.
                self.assertEqual(grew("vlm:prompt_tokens_cached_total"), 4 * prompt)
                self.assertEqual(grew("vlm:images_encoded_total"), 0)  # the solo runs encoded it

    def test_fresh_prompt_is_computed_once(self):
        """An image the server has not seen: the first choice encodes it and computes the prompt
        (but for the template's first rows, which every chat shares), the others take its rows
        while it runs."""
        req = chat("A fresh question about this", image_seeds=[42], max_tokens=4, temperature=0.8, seed=5)
        before = self.srv.metrics()
        r = self.post("/v1/chat/completions", dict(req, n=3))
        m = self.srv.metrics()
        prompt = r["usage"]["prompt_tokens"]
        first = r["usage"]["prompt_tokens_details"]["cached_tokens"]  # the first choice's
        self.assertLess(first, 8)  # "<bos><start_of_turn>user\n" at most: the image follows
        self.assertEqual(metric(m, "vlm:images_encoded_total") - metric(before, "vlm:images_encoded_total"), 1)
        self.assertEqual(metric(m, "vlm:prompt_tokens_cached_total", 0)
                         - metric(before, "vlm:prompt_tokens_cached_total", 0), first + 2 * (prompt - 1))
        solo = self.post("/v1/chat/completions", dict(req, seed=7))
        self.assertEqual(r["choices"][2]["token_ids"], solo["choices"][0]["token_ids"])

    def test_streamed_choices_through_the_openai_client(self):
        req = chat("Count the stars", image_seeds=[43], max_tokens=8, temperature=1.0, seed=9)
        whole = self.post("/v1/chat/completions", dict(req, n=3))
        res = openai_client(self.srv, [
            {"op": "chat", "params": dict(req, n=3, stream=True, stream_options={"include_usage": True})},
            {"op": "completion", "params": {"model": "tiny-f32", "prompt": ["Once upon", "A cat"], "n": 2,
                                            "max_tokens": 6, "temperature": 1.0, "seed": 3, "stream": True,
                                            "return_token_ids": True}},
            {"op": "completion", "params": {"model": "tiny-f32", "prompt": ["Once upon", "A cat"], "n": 2,
                                            "max_tokens": 6, "temperature": 1.0, "seed": 3,
                                            "return_token_ids": True}},
        ])
        for r in res:
            self.assertNotIn("error", r, r)
        chunks = res[0]["chunks"]
        got = stream_choices(chunks)
        self.assertEqual(sorted(got), [0, 1, 2])
        for j in range(3):
            self.assertEqual(got[j]["roles"], 1)
            self.assertEqual(got[j]["finish"], [whole["choices"][j]["finish_reason"]])
            self.assertEqual(got[j]["ids"], whole["choices"][j]["token_ids"], f"choice {j}")
            self.assertEqual(got[j]["text"], whole["choices"][j]["message"]["content"])
        self.assertEqual(chunks[-1]["choices"], [])
        usage = dict(chunks[-1]["usage"])
        usage["prompt_tokens_details"] = dict(usage["prompt_tokens_details"], cached_tokens=0)
        self.assertEqual(usage["prompt_tokens_details"]["image_tokens"], 16)
        self.assertEqual(usage, dict(whole["usage"], prompt_tokens_details={"cached_tokens": 0, "image_tokens": 16}))
        # The second time round the whole prompt came from the prefix cache (kept where its prefill
        # ended).
        self.assertEqual(chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"])
        # Completions: prompt i's choice j is index 2i + j, in the stream and in the whole response.
        streamed, plain = stream_choices(res[1]["chunks"]), res[2]["response"]["choices"]
        self.assertEqual([c["index"] for c in plain], [0, 1, 2, 3])
        for c in plain:
            self.assertEqual(streamed[c["index"]]["ids"], c["token_ids"])
            self.assertEqual(streamed[c["index"]]["text"], c["text"])
            self.assertEqual(streamed[c["index"]]["finish"], [c["finish_reason"]])

    def test_lists_of_prompts_and_token_ids(self):
        base = {"model": "tiny-f32", "max_tokens": 5, "temperature": 1.0, "seed": 11, "return_token_ids": True}
        texts = ["The sea is", "Two plus two"]
        solo = {(i, j): self.post("/v1/completions", dict(base, prompt=t, seed=11 + j))
                for i, t in enumerate(texts) for j in range(2)}
        r = self.post("/v1/completions", dict(base, prompt=texts, n=2))
        self.assertEqual(len(r["choices"]), 4)
        for i in range(2):
            for j in range(2):
                c, want = r["choices"][2 * i + j], solo[(i, j)]["choices"][0]
                self.assertEqual(c["index"], 2 * i + j)
                self.assertEqual((c["token_ids"], c["text"]), (want["token_ids"], want["text"]), (i, j))
        self.assertEqual(r["usage"]["prompt_tokens"], sum(solo[(i, 0)]["usage"]["prompt_tokens"] for i in range(2)))
        self.assertEqual(r["usage"]["completion_tokens"], sum(s["usage"]["completion_tokens"] for s in solo.values()))

        # A prompt given as its token ids (what /tokenize gives, <bos> included) answers as its text.
        ids = [self.post("/tokenize", {"model": "tiny-f32", "prompt": t})["tokens"] for t in texts]
        one = self.post("/v1/completions", dict(base, prompt=ids[0], echo=True))
        self.assertEqual(one["choices"][0]["token_ids"], solo[(0, 0)]["choices"][0]["token_ids"])
        self.assertEqual(one["choices"][0]["text"], "<bos>" + texts[0] + solo[(0, 0)]["choices"][0]["text"])
        both = self.post("/v1/completions", dict(base, prompt=ids))
        self.assertEqual([c["token_ids"] for c in both["choices"]],
                         [solo[(i, 0)]["choices"][0]["token_ids"] for i in range(2)])
        # echo: each choice begins with its own prompt.
        echoed = self.post("/v1/completions", dict(base, prompt=texts, n=2, echo=True))
        for c in echoed["choices"]:
            self.assertTrue(c["text"].startswith(texts[c["index"] // 2]), c)
            self.assertEqual(c["text"][len(texts[c["index"] // 2]):], r["choices"][c["index"]]["text"])

    def test_refusals(self):
        base = {"model": "tiny-f32", "max_tokens": 2}
        cases = [
            ("empty list", dict(base, prompt=[]), "prompt"),
            ("mixed list", dict(base, prompt=["a", [1, 2]]), "prompt[1]"),
            ("ids and text", dict(base, prompt=[2, "a"]), "prompt"),
            ("empty ids", dict(base, prompt=[[]]), "prompt[0]"),
            ("negative id", dict(base, prompt=[2, -1]), "prompt"),
            ("id past the vocabulary", dict(base, prompt=[2, 10 ** 9]), "prompt"),
            ("image token without an image", dict(base, prompt=[2, 262144]), "prompt"),
            ("prompt object", dict(base, prompt={"text": "a"}), "prompt"),
            ("too many choices", dict(base, prompt=["a"] * 20, n=7), "n"),
            ("more prompts than 128", dict(base, prompt=["a"] * 129), "prompt"),
            ("more choices than the queue", dict(base, prompt=["a"] * 13, n=5), "n"),
        ]
        for name, body, param in cases:
            with self.subTest(name):
                code, _, r = self.srv.post("/v1/completions", body)
                self.assertEqual(code, 400, r)
                self.assertEqual(r["error"]["param"], param, r)
        code, _, r = self.srv.post("/tokenize", {"model": "tiny-f32", "prompt": ["a", "b"]})
        self.assertEqual((code, r["error"]["param"]), (400, "prompt"))
        m = self.srv.metrics()
        self.assertEqual(metric(m, "vlm:num_requests_running"), 0)
        self.assertEqual(metric(m, "vlm:num_requests_waiting"), 0)

    def test_a_client_that_leaves_cancels_every_choice(self):
        long = chat("Write a long story", image_seeds=[44], max_tokens=400, temperature=1.0, seed=1, n=3,
                    stream=True)
        before = self.srv.metrics()
        res = openai_client(self.srv, [{"op": "chat", "params": long, "abort_after": 3}])
        self.assertTrue(res[0]["aborted"], res)
        deadline = time.time() + 30
        while time.time() < deadline:
            m = self.srv.metrics()
            if metric(m, "vlm:num_requests_running") == 0 and metric(m, "vlm:kv_cache_bytes") == 0:
                break
            time.sleep(0.05)
        self.assertEqual(metric(m, "vlm:requests_cancelled_total", 0) - metric(before, "vlm:requests_cancelled_total", 0),
                         3)
        self.assertLess(metric(m, "vlm:generation_tokens_total") - metric(before, "vlm:generation_tokens_total"),
                        3 * 400)
        self.assertEqual(metric(m, "vlm:kv_cache_bytes"), 0)


@unittest.skipUnless(BIN and FIXTURES, "VLM_BIN and VLM_FIXTURES must be set")
class TestBatchChoices(unittest.TestCase):
    def test_vlm_batch_answers_n_choices_as_the_server(self):
        req = chat("Name a colour", image_seeds=[45], max_tokens=6, temperature=1.0, seed=21, n=3)
        with tempfile.TemporaryDirectory() as d:
            folder = windowed_copy(d)
            with Server(folder, threads=2) as srv:
                code, _, want = srv.post("/v1/chat/completions", req)
                self.assertEqual(code, 200, want)
            inp, out = os.path.join(d, "in.jsonl"), os.path.join(d, "out.jsonl")
            with open(inp, "w") as f:
                f.write(json.dumps({"custom_id": "a", "body": req}) + "\n")
            subprocess.run([BIN, "batch", "--model", folder, "--input", inp, "--output", out, "--threads", "2"],
                           check=True, capture_output=True, timeout=600)
            with open(out) as f:
                got = json.loads(f.readline())["response"]["body"]
        self.assertEqual([c["token_ids"] for c in got["choices"]], [c["token_ids"] for c in want["choices"]])
        self.assertEqual(got["usage"]["prompt_tokens"], want["usage"]["prompt_tokens"])
        self.assertEqual(got["usage"]["completion_tokens"], want["usage"]["completion_tokens"])


if __name__ == "__main__":
    unittest.main()
