"""The prompt's logprobs (/v1/completions with `echo` and `logprobs`, as lm-evaluation-harness's
loglikelihood requests send them): each prompt token's logprob and alternatives equal what the
server reports for that token when it is generated after the same tokens (forced by logit_bias,
whose logprobs are of the raw logits), across prefill chunks of 64 rows; the first token has none;
streamed equals whole; a batch of token-id prompts reads as lm-eval reads it."""
import json
import unittest

from server_util import BIN, FIXTURES, SharedServer

TOL = 2e-5  # a row computed in a 64-row chunk against the same row last in its prompt


@unittest.skipUnless(BIN and FIXTURES, "VLM_BIN and VLM_FIXTURES must be set")
class TestPromptLogprobs(SharedServer):

    def post(self, path, body):
        code, _, r = self.srv.post(path, body)
        self.assertEqual(code, 200, r)
        return r

    def forced(self, ids, p, k):
        """The logprob and top-k of ids[p] when generated after ids[:p]."""
        r = self.post("/v1/completions", {"prompt": ids[:p], "max_tokens": 1, "logprobs": k, "temperature": 0,
                                          "logit_bias": {str(ids[p]): 100}, "return_token_ids": True})
        c = r["choices"][0]
        self.assertEqual(c["token_ids"], [ids[p]])
        return c["logprobs"]["token_logprobs"][0], c["logprobs"]["top_logprobs"][0]

    def check_against_forced(self, ids, got, positions, k):
        lps, tops = got["token_logprobs"], got["top_logprobs"]
        for p in positions:
            want_lp, want_top = self.forced(ids, p, k)
            self.assertAlmostEqual(lps[p], want_lp, delta=TOL, msg=f"position {p}")
            self.assertEqual(list(tops[p]), list(want_top), f"position {p}")
            for key in want_top:
                self.assertAlmostEqual(tops[p][key], want_top[key], delta=TOL)

    def test_each_prompt_token_scores_as_if_generated(self):
        text = "The quick brown fox jumps over the lazy dog near the river bank"
        ids = self.post("/tokenize", {"prompt": text})["tokens"]
        r = self.post("/v1/completions", {"prompt": text, "echo": True, "logprobs": 3, "max_tokens": 2,
                                          "temperature": 0})
        c = r["choices"][0]
        lp = c["logprobs"]
        self.assertTrue(c["text"].startswith(text))
        self.assertEqual(len(lp["tokens"]), len(ids) + 2)
        self.assertEqual(lp["tokens"][0], "<bos>")
        self.assertIsNone(lp["token_logprobs"][0])
        self.assertIsNone(lp["top_logprobs"][0])
        # text_offset indexes the echoed text: <bos> is not in it.
        self.assertEqual(lp["text_offset"][:3], [0, 0, len("The")])
        self.check_against_forced(ids, lp, range(1, len(ids)), 3)
        self.assertEqual(r["usage"]["prompt_tokens"], len(ids))
        self.assertEqual(r["usage"]["completion_tokens"], 2)

        # Again: nothing is taken from the prefix cache (every row's logits are needed), same numbers.
        again = self.post("/v1/completions", {"prompt": text, "echo": True, "logprobs": 3, "max_tokens": 2,
                                              "temperature": 0})
        self.assertEqual(again["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
        self.assertEqual(again["choices"][0]["logprobs"], lp)

        # Streamed: the prompt's chunk carries the same tokens and logprobs.
        status, events = self.srv.events("/v1/completions", {"prompt": text, "echo": True, "logprobs": 3,
                                                             "max_tokens": 2, "temperature": 0, "stream": True})
        self.assertEqual(status, 200)
        events = [json.loads(e) for e in events if e != "[DONE]"]
        chunks = [e["choices"][0] for e in events if e.get("choices")]
        tokens = [t for ch in chunks if ch["logprobs"] for t in ch["logprobs"]["tokens"]]
        logprobs = [t for ch in chunks if ch["logprobs"] for t in ch["logprobs"]["token_logprobs"]]
        self.assertEqual(tokens, lp["tokens"])
        self.assertEqual(logprobs, lp["token_logprobs"])
        self.assertEqual("".join(ch["text"] for ch in chunks), c["text"])

    def test_long_prompts_score_across_chunks(self):
        ids = self.post("/tokenize", {"prompt": " ".join(f"word{i}" for i in range(60))})["tokens"]
        self.assertGreater(len(ids), 150)
        r = self.post("/v1/completions", {"prompt": ids, "echo": True, "logprobs": 2, "max_tokens": 0})
        lp = r["choices"][0]["logprobs"]
        self.assertEqual(len(lp["token_logprobs"]), len(ids))
        self.assertEqual(r["usage"]["completion_tokens"], 0)
        self.check_against_forced(ids, lp, [1, 63, 64, 65, 127, 128, len(ids) - 1], 2)

    def test_ids_without_a_logprob_are_refused(self):
        # 262150 is a padding row of the embedding table: in the vocabulary, never answered with.
        code, _, r = self.srv.post("/v1/completions", {"prompt": [2, 262150], "echo": True, "logprobs": 1,
                                                       "max_tokens": 1})
        self.assertEqual(code, 400, r)
        self.assertIn("262150", r["error"]["message"])
        code, _, r = self.srv.post("/v1/completions", {"prompt": [2, 262150], "max_tokens": 1})
        self.assertEqual(code, 200, r)  # without echo nothing asks for its logprob

    def test_lm_eval_loglikelihood_requests(self):
        """lm-eval's local-completions: token-id prompts in a batch, echo, logprobs 1, max_tokens 1;
        it sums token_logprobs[ctxlen:-1] and compares each with its top_logprobs' best."""
        context = self.post("/tokenize", {"prompt": "Question: what colour is the sky? Answer:"})["tokens"]
        conts = [self.post("/tokenize", {"prompt": c, "add_special_tokens": False})["tokens"]
                 for c in [" blue", " green", " the colour of the sea"]]
        prompts = [context + c for c in conts]
        r = self.post("/v1/completions", {"prompt": prompts, "temperature": 0, "max_tokens": 1, "logprobs": 1,
                                          "seed": 1234, "echo": True})
        self.assertEqual([c["index"] for c in r["choices"]], [0, 1, 2])
        for choice, cont, ids in zip(r["choices"], conts, prompts):
            lps = choice["logprobs"]["token_logprobs"]
            tops = choice["logprobs"]["top_logprobs"]
            self.assertEqual(len(lps), len(ids) + 1)
            part = lps[len(context):-1]
            self.assertEqual(len(part), len(cont))
            for lp_, top in zip(part, tops[len(context):-1]):
                self.assertLessEqual(lp_, max(top.values()) + 1e-6)
            # The continuation's logprobs are those of the tokens forced one by one.
            self.check_against_forced(ids, choice["logprobs"], range(len(context), len(ids)), 1)


if __name__ == "__main__":
    unittest.main()
