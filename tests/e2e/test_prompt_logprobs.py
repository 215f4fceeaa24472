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

    def forced(self, ids, p, k):
        """The logprob and top-k of ids[p] when generated after ids[:p]."""
        r = self.post_ok("/v1/completions", {"prompt": ids[:p], "max_tokens": 1, "logprobs": k, "temperature": 0,
                                          "logit_bias": {str(ids[p]): 100}, "return_token_ids": True, "ignore_eos": True})
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
        ids = self.post_ok("/tokenize", {"prompt": text})["tokens"]
        r = self.post_ok("/v1/completions", {"prompt": text, "echo": True, "logprobs": 3, "max_tokens": 2,
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
        again = self.post_ok("/v1/completions", {"prompt": text, "echo": True, "logprobs": 3, "max_tokens": 2,
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
        ids = self.post_ok("/tokenize", {"prompt": " ".join(f"word{i}" for i in range(60))})["tokens"]
        self.assertGreater(len(ids), 150)
        r = self.post_ok("/v1/completions", {"prompt": ids, "echo": True, "logprobs": 2, "max_tokens": 0})
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

    def check_prompt_logprobs(self, ids, got, k, positions):
        """vLLM's prompt_logprobs against each token forced after the tokens before it: the prompt's
        token first with its logprob, then the k most likely with ranks 1..k (skipped where it is one
        of them), and its rank over k where it is not."""
        self.assertEqual(len(got), len(ids))
        self.assertIsNone(got[0])
        for p in positions:
            want_lp, want_top = self.forced(ids, p, k)
            entries = list(got[p].items())
            self.assertEqual(entries[0][0], str(ids[p]))
            mine = entries[0][1]
            self.assertAlmostEqual(mine["logprob"], want_lp, delta=TOL, msg=f"position {p}")
            ranked = sorted(got[p].values(), key=lambda e: e["rank"])[:k]
            self.assertEqual([e["rank"] for e in ranked], list(range(1, k + 1)), f"position {p}")
            self.assertEqual([e["decoded_token"] for e in ranked], list(want_top), f"position {p}")
            for e, lp in zip(ranked, want_top.values()):
                self.assertAlmostEqual(e["logprob"], lp, delta=TOL)
            self.assertEqual(len(got[p]), k + (mine["rank"] > k), f"position {p}")
            if mine["rank"] > k:
                self.assertLess(mine["logprob"], ranked[-1]["logprob"] + TOL)

    def test_vllm_prompt_logprobs(self):
        """vLLM's `prompt_logprobs`: on completions each choice's, on chat the response's (its
        choices share the prompt); each answer token fed back as prompt is its row's best (rank 1)."""
        text = "The quick brown fox jumps over the lazy dog"
        ids = self.post_ok("/tokenize", {"prompt": text})["tokens"]
        answer = self.post_ok("/v1/completions", {"prompt": ids, "max_tokens": 3, "temperature": 0,
                                               "return_token_ids": True})["choices"][0]["token_ids"]
        ids += answer
        r = self.post_ok("/v1/completions", {"prompt": ids, "max_tokens": 1, "prompt_logprobs": 3, "temperature": 0})
        got = r["choices"][0]["prompt_logprobs"]
        self.check_prompt_logprobs(ids, got, 3, range(1, len(ids)))
        self.assertEqual([got[p][str(ids[p])]["rank"] for p in range(len(ids) - 3, len(ids))], [1, 1, 1])
        self.assertIsNone(r["choices"][0]["logprobs"])

        # Chat: the rendered conversation's tokens, once for two choices.
        messages = [{"role": "user", "content": "Name a colour."}]
        chat_ids = self.post_ok("/tokenize", {"messages": messages})["tokens"]
        c = self.post_ok("/v1/chat/completions", {"messages": messages, "max_tokens": 2, "n": 2, "prompt_logprobs": 2})
        self.assertEqual(len(c["choices"]), 2)
        self.assertNotIn("prompt_logprobs", c["choices"][0])
        self.check_prompt_logprobs(chat_ids, c["prompt_logprobs"], 2, range(1, len(chat_ids)))

        # With echo and logprobs 1: the echoed tokens keep one alternative, prompt_logprobs its 4.
        e = self.post_ok("/v1/completions", {"prompt": text, "echo": True, "logprobs": 1, "prompt_logprobs": 4,
                                          "max_tokens": 1, "temperature": 0})["choices"][0]
        self.assertEqual({len(t) for t in e["logprobs"]["top_logprobs"][1:]}, {1})
        self.check_prompt_logprobs(ids[:len(ids) - 3], e["prompt_logprobs"], 4, [1, 5])

    def test_vllm_prompt_logprobs_refused(self):
        for body, why in [({"prompt_logprobs": 1, "stream": True}, "stream"), ({"prompt_logprobs": 21}, "20"),
                          ({"prompt_logprobs": -1}, "0"), ({"prompt_logprobs": "2"}, "integer")]:
            for path, base in [("/v1/completions", {"prompt": "Hi"}),
                               ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})]:
                code, _, r = self.srv.post(path, dict(base, max_tokens=1, **body))
                self.assertEqual(code, 400, (path, body, r))
                self.assertEqual(r["error"]["param"], "prompt_logprobs")
                self.assertIn(why, r["error"]["message"])
        # vLLM takes 0 with a stream (nothing to send).
        status, events = self.srv.events("/v1/completions", {"prompt": "Hi", "max_tokens": 1, "stream": True,
                                                             "prompt_logprobs": 0})
        self.assertEqual(status, 200)

    def test_lm_eval_loglikelihood_requests(self):
        """lm-eval's local-completions: token-id prompts in a batch, echo, logprobs 1, max_tokens 1;
        it sums token_logprobs[ctxlen:-1] and compares each with its top_logprobs' best."""
        context = self.post_ok("/tokenize", {"prompt": "Question: what colour is the sky? Answer:"})["tokens"]
        conts = [self.post_ok("/tokenize", {"prompt": c, "add_special_tokens": False})["tokens"]
                 for c in [" blue", " green", " the colour of the sea"]]
        prompts = [context + c for c in conts]
        r = self.post_ok("/v1/completions", {"prompt": prompts, "temperature": 0, "max_tokens": 1, "logprobs": 1,
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
