"""What ends an answer, through the real server: vLLM's `stop_reason` names the stop string or
`stop_token_ids` id that ended a choice (null for the model's own end or the token limit), on both
endpoints, whole and streamed; `include_stop_str_in_output` keeps the matched string; `min_tokens`
keeps the stop ids out of the first tokens' draws (each such token is the best of its raw row
but the stop id) and lets no stop string end inside them; bad values are 400s naming the field.
Every expectation is read from an unstopped greedy run of the same request."""
import json
import unittest

from server_util import BIN, FIXTURES, SharedServer, chat


def text_of(r):
    c = r["choices"][0]
    return c["message"]["content"] if "message" in c else c["text"]


@unittest.skipUnless(BIN and FIXTURES, "VLM_BIN and VLM_FIXTURES must be set")
class TestStops(SharedServer):
    def post(self, body, path="/v1/chat/completions"):
        code, _, r = self.srv.post(path, body)
        self.assertEqual(code, 200, r)
        return r

    def full(self, **extra):
        """The unstopped greedy answer: its ids, text and each token's text."""
        r = self.post(chat("Tell me about the sea", max_tokens=16, ignore_eos=True, logprobs=True, top_logprobs=3,
                           **extra))
        c = r["choices"][0]
        self.assertEqual(c["finish_reason"], "length")
        self.assertIsNone(c["stop_reason"])
        return c["token_ids"], c["message"]["content"], c["logprobs"]["content"]

    def streamed(self, body, path="/v1/chat/completions"):
        code, events = self.srv.events(path, dict(body, stream=True))
        self.assertEqual(code, 200, events)
        chunks = [json.loads(e) for e in events[:-1]]
        text, finishes, reasons = "", [], []
        for ch in chunks:
            for c in ch["choices"]:
                text += (c.get("delta") or {}).get("content") or c.get("text") or ""
                if c.get("finish_reason"):
                    finishes.append(c["finish_reason"])
                    reasons.append(c["stop_reason"])
                else:
                    self.assertNotIn("stop_reason", c)  # only with the finish, as vLLM
        self.assertEqual(len(finishes), 1)
        return text, finishes[0], reasons[0]

    def test_a_stop_string_is_named_and_cut_or_kept(self):
        ids, text, _ = self.full()
        stop = text[len(text) // 2:len(text) // 2 + 2]
        self.assertTrue(stop)
        cut = text[:text.find(stop)]
        base = chat("Tell me about the sea", max_tokens=16, ignore_eos=True, stop=["never in it", stop])
        r = self.post(base)["choices"][0]
        self.assertEqual((r["message"]["content"], r["finish_reason"], r["stop_reason"]), (cut, "stop", stop))
        self.assertEqual(self.streamed(base), (cut, "stop", stop))
        kept = dict(base, include_stop_str_in_output=True)
        r = self.post(kept)["choices"][0]
        self.assertEqual((r["message"]["content"], r["stop_reason"]), (cut + stop, stop))
        self.assertEqual(self.streamed(kept), (cut + stop, "stop", stop))
        # The completions endpoint names it too.
        prompt = {"model": "tiny-f32", "prompt": "The sea is", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
        whole = self.post(prompt, "/v1/completions")["choices"][0]["text"]
        if len(whole) > 3:
            s = whole[2:4]
            r = self.post(dict(prompt, stop=s), "/v1/completions")["choices"][0]
            self.assertEqual((r["text"], r["finish_reason"], r["stop_reason"]), (whole[:whole.find(s)], "stop", s))
            self.assertEqual(self.streamed(dict(prompt, stop=s), "/v1/completions"), (whole[:whole.find(s)], "stop", s))

    def test_a_stop_token_id_is_named_and_left_out(self):
        ids, _, _ = self.full(temperature=1.0, seed=5)  # sampled: tiny-f32's greedy answer repeats one id
        k = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i])
        body = chat("Tell me about the sea", max_tokens=16, ignore_eos=True, stop_token_ids=[ids[k]], temperature=1.0,
                    seed=5)
        r = self.post(body)["choices"][0]
        self.assertEqual((r["token_ids"], r["finish_reason"], r["stop_reason"]), (ids[:k], "stop", ids[k]))
        self.assertEqual(self.streamed(body)[1:], ("stop", ids[k]))
        # The model's own end is no stop the request named: null (tiny-f32's eos is 1).
        r = self.post(chat("Tell me about the sea", max_tokens=16, logit_bias={"1": 100}))["choices"][0]
        self.assertEqual((r["token_ids"], r["finish_reason"], r["stop_reason"]), ([], "stop", None))

    def test_min_tokens_holds_off_stop_ids_and_strings(self):
        ids, text, tokens = self.full()
        stop_id = ids[0]
        body = chat("Tell me about the sea", max_tokens=16, ignore_eos=True, stop_token_ids=[stop_id], min_tokens=3,
                    logprobs=True, top_logprobs=3)
        r = self.post(body)["choices"][0]
        got = r["token_ids"]
        self.assertGreaterEqual(len(got), 3)
        self.assertNotIn(stop_id, got)
        self.assertEqual(r["finish_reason"] == "stop", r["stop_reason"] == stop_id)
        for t in range(3):
            # Logprobs are of the raw row: the stop id is still its best; the draw was the next one.
            lp = r["logprobs"]["content"][t]
            alts = [a["token"] for a in lp["top_logprobs"]]
            best = [a for a in alts if a != self.piece(stop_id)]
            self.assertEqual(lp["token"], best[0], t)
        # A stop string that the first token's text would complete is passed over until token 2.
        first = tokens[0]["token"]
        self.assertTrue(first)
        s = first[0]
        at_once = self.post(chat("Tell me about the sea", max_tokens=16, ignore_eos=True, stop=[s]))["choices"][0]
        self.assertEqual((at_once["message"]["content"], at_once["stop_reason"]), ("", s))
        later = self.post(chat("Tell me about the sea", max_tokens=16, ignore_eos=True, stop=[s], min_tokens=1))
        again = text.find(s, len(first))
        self.assertEqual(text_of(later), text if again < 0 else text[:again])
        self.assertEqual(later["choices"][0]["stop_reason"], None if again < 0 else s)

    def piece(self, token_id):
        code, _, r = self.srv.post("/detokenize", {"model": "tiny-f32", "tokens": [token_id]})
        self.assertEqual(code, 200, r)
        return r["prompt"]

    def test_bad_values_are_400s_naming_the_field(self):
        base = chat("Hi", max_tokens=8)
        for name, extra, param in [
            ("min_tokens past max_tokens", dict(min_tokens=9), "min_tokens"),
            ("min_tokens negative", dict(min_tokens=-1), "min_tokens"),
            ("min_tokens not an integer", dict(min_tokens="3"), "min_tokens"),
            ("stop_token_ids not a list", dict(stop_token_ids=5), "stop_token_ids"),
            ("stop_token_ids negative", dict(stop_token_ids=[-1]), "stop_token_ids"),
            ("stop_token_ids outside the vocabulary", dict(stop_token_ids=[10 ** 8]), "stop_token_ids"),
            ("include_stop_str_in_output not a boolean", dict(include_stop_str_in_output="yes"),
             "include_stop_str_in_output"),
        ]:
            with self.subTest(name):
                code, _, r = self.srv.post("/v1/chat/completions", dict(base, **extra))
                self.assertEqual(code, 400, r)
                self.assertEqual(r["error"]["param"], param, r)


if __name__ == "__main__":
    unittest.main()
