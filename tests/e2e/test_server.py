"""`vlm serve` against the tiny checkpoints: the OpenAI wire contract through the official `openai`
npm client and raw HTTP (exact SSE chunk sequence, usage, images as data URIs, models, errors
with their 4xx codes, API key, queue full, SIGTERM)."""
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import unittest

from server_util import (BIN, FIXTURES, Server, chat, data_uri, metric, model_dir, openai_client, png_bytes, sanitized,
                         windowed_copy)


def run_ids(prompt, max_tokens, image_files=()):
    """`vlm run --ids`: the single-request CLI path, greedy, for comparison with the server."""
    args = [BIN, "run", "--model", model_dir("tiny-f32"), "--prompt", prompt, "--max-tokens", str(max_tokens),
            "--ids", "--threads", "1"]
    for f in image_files:
        args += ["--image", f]
    out = subprocess.run(args, check=True, capture_output=True, text=True, timeout=300).stdout
    return [int(t) for t in out.split()]


@unittest.skipUnless(BIN and FIXTURES, "VLM_BIN and VLM_FIXTURES must be set")
class TestServer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not shutil.which("node"):
            raise AssertionError("node is required (scripts/setup.sh installs nodejs)")
        cls.srv = Server("tiny-f32")

    @classmethod
    def tearDownClass(cls):
        rc = cls.srv.stop()
        assert rc == 0, f"exit code {rc}"

    # -- health, models, page -------------------------------------------------------------------
    def test_health_and_models(self):
        for status, body in self.srv.health_seen:
            self.assertIn(status, (200, 503))
            if status == 503:
                self.assertEqual(json.loads(body)["error"]["type"], "unavailable_error")
        status, _, body = self.srv.request("GET", "/health")
        self.assertEqual((status, json.loads(body)), (200, {"status": "ok"}))
        r = openai_client(self.srv, [{"op": "models"}, {"op": "retrieve", "id": "tiny-f32"},
                                     {"op": "retrieve", "id": "gpt-4o"}])
        self.assertEqual([m["id"] for m in r[0]["response"]], ["tiny-f32"])
        card = r[1]["response"]
        self.assertEqual(card["object"], "model")
        self.assertEqual(card["context_length"], 1024)
        self.assertTrue(card["capabilities"]["vision"])
        self.assertEqual(card["mask_mode"], "hf")
        self.assertRegex(card["identity"], "^[0-9a-f]{16}$")
        self.assertEqual((r[2]["error"]["status"], r[2]["error"]["name"]), (404, "NotFoundError"))

    def test_chat_page_is_self_contained(self):
        status, h, body = self.srv.request("GET", "/")
        self.assertEqual(status, 200)
        self.assertTrue(h["content-type"].startswith("text/html"))
        page = body.decode()
        self.assertIn("/v1/chat/completions", page)
        for external in ("http://", "https://", "<link", "src=\"http"):
            self.assertNotIn(external, page)

    # -- generation -----------------------------------------------------------------------------
    def test_greedy_chat_equals_vlm_run(self):
        """Non-streamed, streamed (openai client) and `vlm run` give the same greedy tokens."""
        want = run_ids("Hello there", 10)
        body = chat("Hello there", max_tokens=10)
        status, _, r = self.srv.post("/v1/chat/completions", body)
        self.assertEqual(status, 200, r)
        ids = r["choices"][0]["token_ids"]
        self.assertEqual(ids, want)
        self.assertEqual(r["usage"]["completion_tokens"], len(ids))
        self.assertEqual(r["usage"]["total_tokens"], r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"])
        self.assertEqual(r["choices"][0]["finish_reason"], "length" if len(ids) == 10 else "stop")
        res = openai_client(self.srv, [{"op": "chat", "params": dict(body, stream=True,
                                                                     stream_options={"include_usage": True})}])
        chunks = res[0]["chunks"]
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        self.assertEqual(text, r["choices"][0]["message"]["content"])
        streamed_ids = [i for c in chunks if c["choices"] for i in c["choices"][0].get("token_ids", [])]
        self.assertEqual(streamed_ids, ids)
        self.assertEqual(chunks[-1]["usage"]["completion_tokens"], len(ids))

    def test_sse_chunk_sequence_is_openai_exact(self):
        body = chat("Tell me", max_tokens=6, stream=True, stream_options={"include_usage": True})
        del body["return_token_ids"]
        status, events = self.srv.events("/v1/chat/completions", body)
        self.assertEqual(status, 200, events)
        self.assertEqual(events[-1], "[DONE]")
        chunks = [json.loads(e) for e in events[:-1]]
        ids = {c["id"] for c in chunks}
        self.assertEqual(len(ids), 1)
        self.assertTrue(next(iter(ids)).startswith("chatcmpl-"))
        for c in chunks:
            self.assertEqual(c["object"], "chat.completion.chunk")
            self.assertEqual(c["model"], "tiny-f32")
            self.assertIn("system_fingerprint", c)
        first, last, usage = chunks[0], chunks[-2], chunks[-1]
        self.assertEqual(first["choices"], [{"index": 0, "delta": {"role": "assistant", "content": "", "refusal": None},
                                             "logprobs": None, "finish_reason": None}])
        for c in chunks[1:-2]:
            self.assertEqual(set(c["choices"][0]["delta"]), {"content"})
            self.assertIsNone(c["choices"][0]["finish_reason"])
            self.assertIsNone(c["usage"])
        self.assertEqual(last["choices"][0]["delta"], {})
        self.assertIn(last["choices"][0]["finish_reason"], ("stop", "length"))
        self.assertIsNone(last["usage"])
        self.assertEqual(usage["choices"], [])
        u = usage["usage"]
        self.assertEqual(u["total_tokens"], u["prompt_tokens"] + u["completion_tokens"])
        self.assertLessEqual(u["completion_tokens"], 6)
        # Without include_usage no chunk carries a usage key.
        body.pop("stream_options")
        status, events = self.srv.events("/v1/chat/completions", body)
        self.assertTrue(all("usage" not in json.loads(e) for e in events[:-1]))

    def test_image_data_uri(self):
        """An image request counts its image tokens, and answers as `vlm run --image` does."""
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "a.png")
            with open(path, "wb") as f:
                f.write(png_bytes(3))
            want = run_ids("What is this?", 8, [path])
        body = chat("What is this?", image_seeds=[3], max_tokens=8)
        res = openai_client(self.srv, [
            {"op": "chat", "params": body},
            {"op": "chat", "params": dict(body, stream=True, stream_options={"include_usage": True})}])
        r = res[0]["response"]
        self.assertEqual(r["choices"][0]["token_ids"], want)
        self.assertEqual(r["usage"]["prompt_tokens_details"]["image_tokens"], 16)  # mm_tokens_per_image
        # 10 ids for the turn, "\n\n" + <boi> + 16 soft + <eoi> + "\n\n" around the image (HF layout)
        self.assertGreater(r["usage"]["prompt_tokens"], 16 + 10)
        chunks = res[1]["chunks"]
        for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
            self.assertEqual(chunks[-1]["usage"][k], r["usage"][k])
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        self.assertEqual(text, r["choices"][0]["message"]["content"])

    def test_an_image_sent_again_skips_the_vision_tower(self):
        """Every turn of a chat about a picture sends the picture again: from the second time on its
        projector rows come from the image cache (`--image-cache`), and the answers are the ones a
        fresh encode gives (`vlm run`'s, and the server's own without the cache)."""
        first = chat("What is this?", image_seeds=[5], max_tokens=6)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "a.png")
            with open(path, "wb") as f:
                f.write(png_bytes(5))
            want = run_ids("What is this?", 6, [path])

        def counts(srv):
            m = srv.metrics()
            return metric(m, "vlm:images_encoded_total"), metric(m, "vlm:image_cache_hits_total")

        with Server("tiny-f32", args=["--prefix-cache", "0"]) as srv:  # else the next turn takes the image's rows too
            status, _, r1 = srv.post("/v1/chat/completions", first)
            self.assertEqual(status, 200)
            self.assertEqual(r1["choices"][0]["token_ids"], want)
            self.assertEqual(counts(srv), (1, 0))
            second = dict(first, messages=first["messages"] + [
                {"role": "assistant", "content": r1["choices"][0]["message"]["content"]},
                {"role": "user", "content": "And its colors?"}])
            self.assertEqual(srv.post("/v1/chat/completions", second)[0], 200)
            self.assertEqual(counts(srv), (1, 1))
            status, _, again = srv.post("/v1/chat/completions", first)
            self.assertEqual(again["choices"][0]["token_ids"], want)
            self.assertEqual(counts(srv), (1, 2))
            self.assertEqual(srv.post("/v1/chat/completions", chat("What is this?", image_seeds=[6], max_tokens=2))[0], 200)
            self.assertEqual(counts(srv), (2, 2))
            self.assertGreater(metric(srv.metrics(), "vlm:image_cache_bytes"), 0)
        with Server("tiny-f32", args=["--image-cache", "0", "--prefix-cache", "0"]) as srv:
            for _ in range(2):
                status, _, r = srv.post("/v1/chat/completions", first)
                self.assertEqual(r["choices"][0]["token_ids"], want)
            self.assertEqual(counts(srv), (2, 0))
            self.assertEqual(metric(srv.metrics(), "vlm:image_cache_bytes"), 0)

    def test_the_next_turn_of_a_chat_starts_from_the_previous_one(self):
        """The second turn's prompt begins with the first turn's prompt and answer: their rows come
        from the prefix cache (`--prefix-cache`; `usage.prompt_tokens_details.cached_tokens`), the
        image is not encoded again, and the answer is the one the server gives without caches."""
        first = chat("What is this?", image_seeds=[7], max_tokens=6)

        def second(r1):
            return dict(first, messages=first["messages"] + [
                {"role": "assistant", "content": r1["choices"][0]["message"]["content"]},
                {"role": "user", "content": "And its colors?"}])

        answers = []
        # tiny-f32 with a sliding window of 64 instead of 8, so that the sliding layers' rings hold
        # the whole first turn (with 8 only a prompt that continues the whole finished sequence
        # may take its rows, and the template trims the answer it repeats).
        wide = tempfile.TemporaryDirectory()
        self.addCleanup(wide.cleanup)
        folder = windowed_copy(wide.name)
        for args in ([], ["--prefix-cache", "0", "--image-cache", "0"]):
            with Server(folder, args=args) as srv:
                status, _, r1 = srv.post("/v1/chat/completions", first)
                self.assertEqual(status, 200)
                self.assertEqual(r1["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
                status, _, r2 = srv.post("/v1/chat/completions", second(r1))
                self.assertEqual(status, 200)
                m = srv.metrics()
                cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"]
                if args:
                    self.assertEqual(cached, 0)
                    self.assertEqual(metric(m, "vlm:images_encoded_total"), 2)
                    self.assertEqual(metric(m, "vlm:prefix_cache_bytes"), 0)
                else:
                    self.assertGreaterEqual(cached, r1["usage"]["prompt_tokens"])
                    self.assertLess(cached, r2["usage"]["prompt_tokens"])
                    self.assertEqual(metric(m, "vlm:prompt_tokens_cached_total"), cached)
                    self.assertEqual(metric(m, "vlm:images_encoded_total"), 1)
                    self.assertGreater(metric(m, "vlm:prefix_cache_bytes"), 0)
                answers.append((r1["choices"][0]["token_ids"], r2["choices"][0]["token_ids"]))
        self.assertEqual(answers[0], answers[1])

    def test_an_edited_last_message_takes_the_conversation_before_it(self):
        """A front-end that edits the last message resends the conversation up to it. With rings of
        8 and a last message longer than the 64 rows every cache keeps past them, the prompt kept
        where the first prefill ended still gives every position up to the edit (the server marks
        the last user turn: docs/gemma3/decoder.md, "Prefix cache"); the answer is the one the
        server gives without caches."""
        words = "".join(f" and then the {i}th thing" for i in range(30))

        def edited(first_words):
            body = chat("What is this?", image_seeds=[9], max_tokens=4)
            body["messages"] += [{"role": "assistant", "content": "Noise, mostly."},
                                 {"role": "user", "content": first_words + words}]
            return body

        a, b = edited("Tell me more"), edited("Say more")
        answers = []
        for args in ([], ["--prefix-cache", "0", "--image-cache", "0"]):
            with Server("tiny-f32", args=args) as srv:
                ids = [srv.post("/tokenize", {"model": "tiny-f32", "messages": x["messages"]})[2]["tokens"]
                       for x in (a, b)]
                differ = next(i for i, (x, y) in enumerate(zip(*ids)) if x != y)
                self.assertGreater(len(ids[1]) - differ, 64 + 8)
                status, _, r1 = srv.post("/v1/chat/completions", a)
                self.assertEqual(status, 200, r1)
                status, _, r2 = srv.post("/v1/chat/completions", b)
                self.assertEqual(status, 200, r2)
                self.assertEqual(r2["usage"]["prompt_tokens"], len(ids[1]))
                self.assertEqual(r2["usage"]["prompt_tokens_details"]["cached_tokens"], 0 if args else differ)
                answers.append(r2["choices"][0]["token_ids"])
        self.assertEqual(answers[0], answers[1])

    def test_an_edited_last_message_sent_as_text_takes_the_conversation_before_it(self):
        """The same through /v1/completions from a client that renders the chat template itself
        (SillyTavern's text completion): the server finds the last "<start_of_turn>user" in the
        prompt's ids and marks it as the chat's last user turn."""
        words = "".join(f" and then the {i}th thing" for i in range(30))

        def prompt(first_words):
            return ("<bos><start_of_turn>user\nWhat is this?<end_of_turn>\n<start_of_turn>model\nNoise, mostly."
                    f"<end_of_turn>\n<start_of_turn>user\n{first_words}{words}<end_of_turn>\n<start_of_turn>model\n")

        a, b = prompt("Tell me more"), prompt("Say more")
        answers = []
        for args in ([], ["--prefix-cache", "0"]):
            with Server("tiny-f32", args=args) as srv:
                ids = [srv.post("/tokenize", {"model": "tiny-f32", "prompt": x})[2]["tokens"] for x in (a, b)]
                differ = next(i for i, (x, y) in enumerate(zip(*ids)) if x != y)
                self.assertGreater(len(ids[1]) - differ, 64 + 8)
                for p in (a, b):
                    status, _, r = srv.post("/v1/completions", {"model": "tiny-f32", "prompt": p, "max_tokens": 4,
                                                               "temperature": 0, "return_token_ids": True})
                    self.assertEqual(status, 200, r)
                self.assertEqual(r["usage"]["prompt_tokens"], len(ids[1]))
                self.assertEqual(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0 if args else differ)
                answers.append(r["choices"][0]["token_ids"])
        self.assertEqual(answers[0], answers[1])

    def test_cache_sizes_must_be_whole_mib(self):
        for flag in ("--image-cache", "--prefix-cache"):
            for bad in ("nan", "-1", "1.5", "inf", "2000000"):
                p = subprocess.run([BIN, "serve", "--model", model_dir("tiny-f32"), "--port", "0", flag, bad],
                                   capture_output=True, text=True, timeout=60)
                self.assertNotEqual(p.returncode, 0, f"{flag} {bad}")
                self.assertIn(flag, p.stderr + p.stdout)

    def test_completions_endpoint(self):
        res = openai_client(self.srv, [
            {"op": "completion", "params": {"model": "tiny-f32", "prompt": "Once upon", "temperature": 0}},
            {"op": "completion", "params": {"model": "tiny-f32", "prompt": "Once upon", "temperature": 0,
                                            "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}}])
        r = res[0]["response"]
        self.assertEqual(r["object"], "text_completion")
        self.assertLessEqual(r["usage"]["completion_tokens"], 16)  # OpenAI's default max_tokens
        if r["usage"]["completion_tokens"] == 16:
            self.assertEqual(r["choices"][0]["finish_reason"], "length")
        chunks = res[1]["chunks"]
        text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        self.assertTrue(r["choices"][0]["text"].startswith(text) or r["usage"]["completion_tokens"] < 5)
        self.assertLessEqual(chunks[-1]["usage"]["completion_tokens"], 5)

    def test_sampling_defaults_and_seed(self):
        """Omitted sampling fields come from generation_config.json (do_sample, top_k 64, top_p
        0.95): a seed repeats, and unseeded sampling is not the greedy answer every time."""
        base = chat("Pick a word", max_tokens=12)
        del base["temperature"]
        seeded = [self.srv.post("/v1/chat/completions", dict(base, seed=7))[2]["choices"][0]["token_ids"]
                  for _ in range(2)]
        self.assertEqual(seeded[0], seeded[1])
        greedy = self.srv.post("/v1/chat/completions", dict(base, temperature=0))[2]["choices"][0]["token_ids"]
        drawn = [self.srv.post("/v1/chat/completions", dict(base, seed=s))[2]["choices"][0]["token_ids"]
                 for s in range(1, 5)]
        self.assertTrue(any(d != greedy for d in drawn), "sampling defaults look greedy")

    def test_stop_strings_and_logprobs(self):
        full = self.srv.post("/v1/chat/completions", chat("Hello", max_tokens=12))[2]["choices"][0]["message"]["content"]
        if len(full) >= 4:
            stop = full[2:4]
            r = self.srv.post("/v1/chat/completions", chat("Hello", max_tokens=12, stop=[stop]))[2]
            self.assertEqual(r["choices"][0]["message"]["content"], full[:full.index(stop)])
            self.assertEqual(r["choices"][0]["finish_reason"], "stop")
        r = self.srv.post("/v1/chat/completions", chat("Hello", max_tokens=4, logprobs=True, top_logprobs=3))[2]
        lp = r["choices"][0]["logprobs"]["content"]
        self.assertEqual(len(lp), r["usage"]["completion_tokens"])
        for t in lp:
            self.assertLessEqual(t["logprob"], 0.0)
            self.assertEqual(len(t["top_logprobs"]), 3)
            # greedy: the chosen token is the most likely one
            self.assertAlmostEqual(t["top_logprobs"][0]["logprob"], t["logprob"], places=5)
            self.assertEqual(bytes(t["bytes"]).decode("utf-8", "replace"), t["token"])

    def test_tokenize_and_detokenize(self):
        # What a chat request's prompt takes, its image's soft tokens included, before sending it.
        body = chat("What is this?", image_seeds=(3,))
        status, _, t = self.srv.post("/tokenize", {"messages": body["messages"], "return_token_strs": True})
        self.assertEqual(status, 200, t)
        used = self.srv.post("/v1/chat/completions", dict(body, max_tokens=1))[2]["usage"]["prompt_tokens"]
        self.assertEqual(t["count"], used)
        self.assertEqual(len(t["tokens"]), used)
        self.assertEqual(len(t["token_strs"]), used)
        self.assertEqual(t["tokens"][0], 2)  # the template's <bos>, once
        self.assertEqual(t["tokens"].count(2), 1)
        card = json.loads(self.srv.request("GET", "/v1/models")[2])["data"][0]
        self.assertEqual(t["max_model_len"], card["max_model_len"])
        # A raw prompt as /v1/completions reads it; without special tokens, no <bos>.
        text = "The quick brown fox"
        t1 = self.srv.post("/tokenize", {"prompt": text})[2]
        used = self.srv.post("/v1/completions", {"prompt": text, "max_tokens": 1})[2]["usage"]["prompt_tokens"]
        self.assertEqual(t1["count"], used)
        t0 = self.srv.post("/tokenize", {"prompt": text, "add_special_tokens": False})[2]
        self.assertEqual(t0["tokens"], t1["tokens"][1:])
        self.assertEqual(self.srv.post("/detokenize", {"tokens": t0["tokens"]})[2], {"prompt": text})
        self.assertEqual(self.srv.post("/detokenize", {"tokens": t1["tokens"]})[2], {"prompt": "<bos>" + text})
        for path, bad, param in [("/tokenize", {"prompt": "a", "messages": []}, "prompt"),
                                 ("/tokenize", {}, "prompt"),
                                 ("/tokenize", {"messages": body["messages"], "add_generation_prompt": True,
                                                "continue_final_message": True}, "continue_final_message"),
                                 ("/tokenize", {"messages": body["messages"], "add_special_tokens": True},
                                  "add_special_tokens"),
                                 ("/detokenize", {"tokens": [1, 10 ** 7]}, "tokens"),
                                 ("/detokenize", {"tokens": "abc"}, "tokens")]:
            status, _, r = self.srv.post(path, bad)
            self.assertEqual(status, 400, (path, bad, r))
            self.assertEqual(r["error"]["param"], param)
        self.assertEqual(self.srv.post("/tokenize", {"prompt": "a", "model": "gpt-4o"})[0], 404)

    def test_logit_bias(self):
        free = self.srv.post("/v1/chat/completions", chat("Hello", max_tokens=6))[2]["choices"][0]["token_ids"]
        forced = self.srv.post("/v1/chat/completions", chat("Hello", max_tokens=6, logit_bias={"236761": 100}))[2]
        self.assertEqual(forced["choices"][0]["token_ids"], [236761] * 6)
        banned = self.srv.post("/v1/chat/completions", chat("Hello", max_tokens=6, logit_bias={str(free[0]): -100}))[2]
        self.assertNotEqual(banned["choices"][0]["token_ids"][0], free[0])
        for bias, msg in [({"abc": 1}, "not a token id"), ({"5": 101}, "[-100, 100]"), ({"-3": 1}, "not a token id"),
                          ({"262144": 5}, "outside the vocabulary"), ([1, 2], "an object")]:
            status, _, r = self.srv.post("/v1/chat/completions", chat("Hello", max_tokens=2, logit_bias=bias))
            self.assertEqual(status, 400, r)
            self.assertIn(msg, r["error"]["message"])

    # -- client mistakes ------------------------------------------------------------------------
    def test_client_mistakes_are_4xx_openai_errors(self):
        good = chat("Hi", max_tokens=2)
        cases = [
            ("malformed JSON", b"{\"model\": ", 400, None),
            ("not an object", [1, 2], 400, "body"),
            ("no messages", {"model": "tiny-f32"}, 400, "messages"),
            ("empty messages", {"messages": []}, 400, "messages"),
            ("messages not a list", {"messages": "hi"}, 400, "messages"),
            ("wrong role", {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role"),
            ("content wrong type", {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
            ("unknown part", {"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}, 400,
             "messages[0].content[0].type"),
            ("temperature type", dict(good, temperature="hot"), 400, "temperature"),
            ("temperature range", dict(good, temperature=3), 400, "temperature"),
            ("max_tokens type", dict(good, max_tokens=1.5), 400, "max_tokens"),
            ("max_tokens zero", dict(good, max_tokens=0), 400, "max_tokens"),
            ("top_logprobs without logprobs", dict(good, top_logprobs=2), 400, "top_logprobs"),
            ("n zero", dict(good, n=0), 400, "n"),
            ("n over 128", dict(good, n=129), 400, "n"),
            ("n over the queue", dict(good, n=100), 400, "n"),
            ("tools not a list", dict(good, tools={"type": "function"}), 400, "tools"),
            ("response_format type", dict(good, response_format={"type": "json"}), 400, "response_format.type"),
            ("schema keyword", dict(good, response_format={"type": "json_schema", "json_schema": {
                "name": "x", "schema": {"type": "string", "pattern": "^a"}}}), 400,
             "response_format.json_schema.schema"),
            ("json_schema not an object", dict(good, response_format={"type": "json_schema", "json_schema": "x"}),
             400, "response_format.json_schema"),
            ("stream_options without stream", dict(good, stream_options={"include_usage": True}), 400,
             "stream_options"),
            ("stop list too long", dict(good, stop=["a", "b", "c", "d", "e"]), 400, "stop"),
            ("unknown model", dict(good, model="gpt-4o"), 404, "model"),
            ("bad base64", {"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@@"}}]}]}, 400,
             "messages[0].content[0].image_url"),
            ("not an image", {"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8gd29ybGQ="}}]}]}, 400,
             "messages[0].content[0].image_url"),
            ("truncated png", {"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": data_uri(1)[:200]}}]}]}, 400,
             "messages[0].content[0].image_url"),
            ("remote url", {"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest"}}]}]}, 400,
             "messages[0].content[0].image_url"),
            ("file url", {"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}]}, 400,
             "messages[0].content[0].image_url"),
            ("too many images", {"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": data_uri(1)}}] * 9}]}, 400,
             "messages[0].content[8]"),
            ("image slots vs images", {"messages": [{"role": "assistant", "content": [
                {"type": "image_url", "image_url": {"url": data_uri(1)}}]}]}, 400, "messages[0].content[0]"),
            ("roles must alternate", {"messages": [{"role": "user", "content": "a"},
                                                   {"role": "user", "content": "b"}]}, 400, "messages"),
            ("context", dict(good, messages=[{"role": "user", "content": "word " * 1100}]), 400, "messages"),
            ("context with max_tokens", dict(good, max_tokens=1020), 400, "max_tokens"),
        ]
        for name, body, status, param in cases:
            with self.subTest(name):
                if isinstance(body, bytes):
                    code, h, raw = self.srv.request("POST", "/v1/chat/completions", body)
                    r = json.loads(raw)
                else:
                    code, h, r = self.srv.post("/v1/chat/completions", body)
                self.assertEqual(code, status, r)
                err = r["error"]
                self.assertEqual(set(err), {"message", "type", "param", "code"})
                self.assertTrue(err["message"])
                self.assertEqual(err["type"], "not_found_error" if status == 404 else "invalid_request_error")
                if param is not None:
                    self.assertEqual(err["param"], param, err)
        # The context message names both numbers.
        code, _, r = self.srv.post("/v1/chat/completions", dict(good, max_tokens=1020))
        self.assertEqual(r["error"]["code"], "context_length_exceeded")
        self.assertIn("1024", r["error"]["message"])
        self.assertIn("1030", r["error"]["message"])
        # The official client sees the right classes and does not retry.
        res = openai_client(self.srv, [{"op": "chat", "params": dict(good, n=300)},
                                       {"op": "chat", "params": dict(good, model="nope")}])
        self.assertEqual(res[0]["error"]["name"], "BadRequestError")
        self.assertEqual(res[0]["error"]["param"], "n")
        self.assertEqual(res[1]["error"]["name"], "NotFoundError")
        # and the server still serves
        self.assertEqual(self.srv.post("/v1/chat/completions", good)[0], 200)

    def test_http_level_refusals(self):
        # a chunked body, a POST without length, a body over the limit, an unknown route
        raw = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
               b"Content-Type: application/json\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
        from server_util import raw_exchange
        out = raw_exchange(self.srv.host, self.srv.port, raw)
        self.assertTrue(out.startswith(b"HTTP/1.1 411"), out[:100])
        out = raw_exchange(self.srv.host, self.srv.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertTrue(out.startswith(b"HTTP/1.1 411"), out[:100])
        out = raw_exchange(self.srv.host, self.srv.port,
                           b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n{")
        self.assertTrue(out.startswith(b"HTTP/1.1 413"), out[:100])
        self.assertIn(b"\"type\":\"invalid_request_error\"", out)
        status, _, body = self.srv.request("GET", "/v1/nothing")
        self.assertEqual(status, 404)
        self.assertEqual(json.loads(body)["error"]["code"], "not_found")

    def test_text_only_model_refuses_images(self):
        with Server("tiny-text-f32") as srv:
            code, _, r = srv.post("/v1/chat/completions", dict(chat("x", image_seeds=[1]), model="tiny-text-f32"))
            self.assertEqual(code, 400)
            self.assertEqual(r["error"]["code"], "images_not_supported")
            code, _, r = srv.post("/v1/chat/completions", dict(chat("x"), model="tiny-text-f32"))
            self.assertEqual(code, 200, r)
            self.assertEqual(srv.stop(), 0)


@unittest.skipUnless(BIN and FIXTURES, "VLM_BIN and VLM_FIXTURES must be set")
class TestServerOperator(unittest.TestCase):
    def test_api_key(self):
        with Server("tiny-f32", ["--api-key", "s3cret"]) as srv:
            self.assertEqual(srv.request("GET", "/health")[0], 200)  # public
            code, h, r = srv.post("/v1/chat/completions", chat("x", max_tokens=1))
            self.assertEqual(code, 401)
            self.assertEqual(r["error"]["type"], "authentication_error")
            code, _, _ = srv.post("/v1/chat/completions", chat("x", max_tokens=1), {"Authorization": "Bearer nope"})
            self.assertEqual(code, 401)
            res = openai_client(srv, [{"op": "chat", "params": chat("x", max_tokens=1)}], api_key="wrong")
            self.assertEqual(res[0]["error"]["name"], "AuthenticationError")
            res = openai_client(srv, [{"op": "chat", "params": chat("x", max_tokens=1)}], api_key="s3cret")
            self.assertIn("response", res[0])
            self.assertEqual(srv.stop(), 0)

    def test_file_images_need_the_flag(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "a.png")
            with open(path, "wb") as f:
                f.write(png_bytes(5))
            body = {"model": "tiny-f32", "max_tokens": 2, "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "file://" + path}}, {"type": "text", "text": "x"}]}]}
            with Server("tiny-f32", ["--allow-file-images"]) as srv:
                code, _, r = srv.post("/v1/chat/completions", body)
                self.assertEqual(code, 200, r)
                self.assertEqual(r["usage"]["prompt_tokens_details"]["image_tokens"], 16)
                self.assertEqual(srv.stop(), 0)

    def test_mlock_keeps_the_weights_resident(self):
        """--mlock: the weights' pages are locked (VmLck) while the server runs and answers; without
        it nothing is."""
        if sanitized():
            self.skipTest("the sanitizers' runtimes make mlock a no-op")
        files = [os.path.join(model_dir("tiny-f32"), f) for f in os.listdir(model_dir("tiny-f32"))]
        weights_kb = sum(os.path.getsize(f) for f in files if f.endswith(".safetensors")) // 1024
        with Server("tiny-f32", ["--mlock"]) as srv:
            locked = srv.status_kb("VmLck")
            # Every tensor's pages: the files less their JSON headers (a few kB each), and no more
            # than the files' pages.
            self.assertGreater(locked, weights_kb - 256)
            self.assertLessEqual(locked, weights_kb + 64)
            code, _, r = srv.post("/v1/chat/completions", chat("x", image_seeds=[1], max_tokens=2))
            self.assertEqual(code, 200, r)
            self.assertEqual(srv.stop(), 0)
        with Server("tiny-f32") as srv:
            self.assertEqual(srv.status_kb("VmLck"), 0)
            self.assertEqual(srv.stop(), 0)

    def test_kv_memory_budget_bounds_the_batch(self):
        # tiny-f32: 2 global layers + 4 sliding (window 8), 2 KV heads x 24: 384 bytes a slot.
        # max_tokens 300 on a ~15-token prompt reserves (2 * 315 + 4 * 8) * 384 ~ 254 KB, so a
        # 0.5 MiB budget runs two at once; the whole context (799 KB) never fits. Without a prefix
        # cache: with one each sliding layer's reservation holds 64 more rows (4 * 64 * 384 B).
        with Server("tiny-f32", ["--max-seqs", "8", "--kv-memory", "0.5", "--prefix-cache", "0"], threads=2) as srv:
            body = chat("no max_tokens: the whole context")
            del body["max_tokens"]
            code, _, r = srv.post("/v1/chat/completions", body)
            self.assertEqual(code, 400, r)
            self.assertEqual(r["error"]["code"], "kv_budget_exceeded")
            self.assertIn("more than the whole KV memory budget of 0.5 MiB", r["error"]["message"])
            results, peak, done = [], {"running": 0, "usage": 0.0}, threading.Event()

            def one(i):
                results.append(srv.post("/v1/chat/completions", chat(f"Count {i}", max_tokens=300, ignore_eos=True)))

            def watch():
                while not done.is_set():
                    m = srv.metrics()
                    peak["running"] = max(peak["running"], metric(m, "vlm:num_requests_running", 0))
                    peak["usage"] = max(peak["usage"], metric(m, "vlm:kv_cache_usage_perc", 0))
                    time.sleep(0.02)

            w = threading.Thread(target=watch)
            w.start()
            threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            done.set()
            w.join()
            self.assertEqual(sorted(r[0] for r in results), [200] * 6)
            for _, _, r in results:
                self.assertEqual(r["usage"]["completion_tokens"], 300)
            self.assertEqual(peak["running"], 2)
            self.assertGreater(peak["usage"], 0.5)
            self.assertLessEqual(peak["usage"], 1.0)
            self.assertEqual(srv.stop(), 0)

    def test_full_queue_answers_429_with_retry_after(self):
        with Server("tiny-f32", ["--max-seqs", "1", "--max-queue", "1"]) as srv:
            body = chat("Count", max_tokens=400, ignore_eos=True)  # vLLM's extension: no early stop
            results = []

            def one():
                results.append(srv.post("/v1/chat/completions", body))

            threads = [threading.Thread(target=one) for _ in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            codes = sorted(r[0] for r in results)
            self.assertIn(429, codes)
            self.assertIn(200, codes)
            for code, h, r in results:
                if code == 429:
                    self.assertEqual(h.get("retry-after"), "1")
                    self.assertEqual(r["error"]["type"], "rate_limit_error")
            self.assertEqual(srv.stop(), 0)

    def test_sigterm_finishes_running_requests_then_exits_0(self):
        srv = Server("tiny-f32", ["--shutdown-timeout", "60"])
        try:
            body = chat("Story", max_tokens=300, stream=True)
            got = {}

            def stream():
                got["r"] = srv.events("/v1/chat/completions", body)

            t = threading.Thread(target=stream)
            t.start()
            time.sleep(0.3)
            srv.proc.send_signal(15)
            time.sleep(0.1)
            try:
                code, _, r = srv.post("/v1/chat/completions", chat("late", max_tokens=2))
                self.assertEqual(code, 503)
            except OSError:
                pass  # already closed: also a refusal
            t.join(120)
            status, events = got["r"]
            self.assertEqual(status, 200)
            self.assertEqual(events[-1], "[DONE]")
            self.assertIn(json.loads(events[-2])["choices"][0]["finish_reason"], ("stop", "length"))
            self.assertEqual(srv.stop(), 0)
        finally:
            srv.__exit__()


if __name__ == "__main__":
    unittest.main()
