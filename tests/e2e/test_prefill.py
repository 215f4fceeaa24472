"""Going on from the start of an answer, through the real server: vLLM's continue_final_message
(with add_generation_prompt false) on /v1/chat/completions and /tokenize, and Anthropic's prefill
(a final assistant message) on /v1/messages. The reference is independent of the chat template
code: the conversation written out as text by hand (Gemma 3's turn markers) and sent as a raw
prompt to /v1/completions, which tokenizes it as HF's tokenizer(text) does; the chat answer must
be that completion, token for token."""
import json
import unittest

from server_util import BIN, FIXTURES, SharedServer

USER = "Tell me about the sea"
START = "The sea is"
WRITTEN = f"<bos><start_of_turn>user\n{USER}<end_of_turn>\n<start_of_turn>model\n{START}"


@unittest.skipUnless(BIN and FIXTURES, "VLM_BIN and VLM_FIXTURES must be set")
class TestPrefill(SharedServer):
    def messages(self, final=START):
        return [{"role": "user", "content": USER}, {"role": "assistant", "content": final}]

    def tokens(self, body):
        return self.post_ok("/tokenize", dict(body, model="tiny-f32", add_special_tokens=False))["tokens"]

    def test_the_chat_answer_goes_on_from_the_final_message(self):
        want = self.post_ok("/v1/completions", {"model": "tiny-f32", "prompt": WRITTEN, "max_tokens": 10,
                                             "temperature": 0, "ignore_eos": True, "return_token_ids": True})
        written = self.post_ok("/tokenize", {"model": "tiny-f32", "prompt": WRITTEN})["tokens"]
        body = {"model": "tiny-f32", "messages": self.messages(), "continue_final_message": True,
                "add_generation_prompt": False, "max_tokens": 10, "temperature": 0, "ignore_eos": True,
                "return_token_ids": True}
        self.assertEqual(self.tokens(body), written)
        got = self.post_ok("/v1/chat/completions", body)
        self.assertEqual(got["choices"][0]["message"]["content"], want["choices"][0]["text"])
        self.assertEqual(got["choices"][0]["token_ids"], want["choices"][0]["token_ids"])
        self.assertEqual(got["usage"]["prompt_tokens"], len(written))
        # add_generation_prompt false is its default then; streamed, the same text.
        del body["add_generation_prompt"]
        code, events = self.srv.events("/v1/chat/completions", dict(body, stream=True))
        self.assertEqual(code, 200, events)
        text = "".join((json.loads(e)["choices"][0]["delta"].get("content") or "") for e in events[:-1]
                       if json.loads(e)["choices"])
        self.assertEqual(text, want["choices"][0]["text"])
        # The message's text is trimmed, as the template trims every message.
        self.assertEqual(self.tokens(dict(body, messages=self.messages("  " + START + " \n"))), written)

    def test_how_else_a_prompt_may_end(self):
        msgs = self.messages()
        closed = self.tokens({"messages": msgs})  # a final assistant turn closed, then the model's
        end = self.post_ok("/tokenize", {"prompt": "<end_of_turn>\n<start_of_turn>model\n",
                                      "add_special_tokens": False})["tokens"]
        self.assertEqual(closed[-len(end):], end)
        last = self.tokens({"messages": msgs, "add_generation_prompt": False})
        self.assertEqual(last, closed[:-3])  # no <start_of_turn>model\n
        for name, extra, param in [
            ("both", dict(continue_final_message=True, add_generation_prompt=True), "continue_final_message"),
            ("a final user message", dict(continue_final_message=True,
                                          messages=[{"role": "user", "content": USER}]), "messages"),
            ("blank final text", dict(continue_final_message=True, messages=self.messages("  ")), "messages"),
            ("with tools", dict(continue_final_message=True, tools=[{"type": "function", "function": {"name": "f"}}]),
             "continue_final_message"),
            ("not a boolean", dict(continue_final_message="yes"), "continue_final_message"),
        ]:
            with self.subTest(name):
                body = dict({"model": "tiny-f32", "messages": msgs, "max_tokens": 4}, **extra)
                code, _, r = self.srv.post("/v1/chat/completions", body)
                self.assertEqual(code, 400, r)
                self.assertEqual(r["error"]["param"], param, r)

    def test_anthropic_prefill(self):
        want = self.post_ok("/v1/completions", {"model": "tiny-f32", "prompt": WRITTEN, "max_tokens": 10,
                                             "temperature": 0})["choices"][0]["text"]
        base = {"model": "tiny-f32", "max_tokens": 10, "temperature": 0}
        m = self.post_ok("/v1/messages", dict(base, messages=self.messages()))
        self.assertEqual(m["content"], [{"type": "text", "text": want}])
        # An empty final assistant message is no prefill.
        plain = self.post_ok("/v1/messages", dict(base, messages=[{"role": "user", "content": USER}]))
        self.assertEqual(self.post_ok("/v1/messages", dict(base, messages=self.messages("")))["content"], plain["content"])
        code, _, r = self.srv.post("/v1/messages", dict(base, messages=self.messages(START + " ")))
        self.assertEqual(code, 400, r)
        self.assertEqual(r["error"]["type"], "invalid_request_error")
        self.assertIn("trailing whitespace", r["error"]["message"])


if __name__ == "__main__":
    unittest.main()
