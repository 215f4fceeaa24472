"""Anthropic's Messages API (POST /v1/messages) through the official `@anthropic-ai/sdk` client: a
message is the answer the same request gives as a chat completion (system, text and image blocks),
streamed through client.messages.stream() (whose checks of the event order apply) it equals the
whole one, tools give tool_use blocks whose input validates, a tool_result turn runs, errors come
in Anthropic's shape naming its fields, a stop sequence that ends an answer is named (stop_reason
stop_sequence), and the x-api-key header authenticates."""
import json
import os
import subprocess
import unittest

import jsonschema

from server_util import BIN, FIXTURES, Server, SharedServer, data_uri

JS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "js", "anthropic_client.mjs")
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                            "required": ["city"], "additionalProperties": False}}


def anthropic(srv, jobs, api_key="none"):
    p = subprocess.run(["node", JS, srv.base, api_key], input=json.dumps({"jobs": jobs}), capture_output=True,
                       text=True, timeout=600)
    if p.returncode != 0:
        raise AssertionError(p.stderr)
    return json.loads(p.stdout)


@unittest.skipUnless(BIN and FIXTURES, "VLM_BIN and VLM_FIXTURES must be set")
class TestMessages(SharedServer):
    def chat(self, body):
        code, _, r = self.srv.post("/v1/chat/completions", body)
        self.assertEqual(code, 200, r)
        return r

    def one(self, job):
        res = anthropic(self.srv, [job])[0]
        self.assertNotIn("error", res, res)
        return res

    def test_a_message_is_the_chat_answer_and_streams_the_same(self):
        uri = data_uri(6)
        media, data = uri[len("data:"):].split(";base64,")
        req = {"model": "tiny-f32", "max_tokens": 9, "temperature": 0, "system": "Answer briefly.",
               "messages": [{"role": "user", "content": [
                   {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}},
                   {"type": "text", "text": "What is this?"}]}]}
        want = self.chat({"model": "tiny-f32", "max_tokens": 9, "temperature": 0, "messages": [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri}},
                                         {"type": "text", "text": "What is this?"}]}]})
        m = self.one({"op": "create", "params": req})["response"]
        self.assertTrue(m["id"].startswith("msg_"))
        self.assertEqual((m["type"], m["role"]), ("message", "assistant"))
        self.assertEqual(m["content"], [{"type": "text", "text": want["choices"][0]["message"]["content"]}])
        self.assertEqual(m["stop_reason"],
                         "max_tokens" if want["choices"][0]["finish_reason"] == "length" else "end_turn")
        u = m["usage"]
        self.assertEqual(u["input_tokens"] + u["cache_read_input_tokens"], want["usage"]["prompt_tokens"])
        self.assertEqual(u["output_tokens"], want["usage"]["completion_tokens"])

        res = self.one({"op": "stream", "params": req})
        types = [e["type"] for e in res["events"]]
        self.assertEqual(types[:2], ["message_start", "content_block_start"])
        self.assertEqual(types[-3:], ["content_block_stop", "message_delta", "message_stop"])
        self.assertTrue(all(t == "content_block_delta" for t in types[2:-3]))
        final = res["final"]
        self.assertEqual(final["content"], m["content"])
        self.assertEqual(final["stop_reason"], m["stop_reason"])
        self.assertEqual(final["usage"]["output_tokens"], u["output_tokens"])

    def test_a_stop_sequence_is_named(self):
        req = {"model": "tiny-f32", "max_tokens": 12, "temperature": 0,
               "messages": [{"role": "user", "content": "Tell me about the sea"}]}
        text = self.chat({"model": "tiny-f32", "max_tokens": 12, "temperature": 0, "ignore_eos": True,
                          "messages": req["messages"]})["choices"][0]["message"]["content"]
        stop = text[len(text) // 2:len(text) // 2 + 2]
        self.assertTrue(stop)
        req["stop_sequences"] = ["not in it", stop]
        m = self.one({"op": "create", "params": req})["response"]
        self.assertEqual((m["stop_reason"], m["stop_sequence"]), ("stop_sequence", stop))
        self.assertEqual(m["content"], [{"type": "text", "text": text[:text.find(stop)]}])
        res = self.one({"op": "stream", "params": req})
        self.assertEqual(res["events"][-2]["delta"], {"stop_reason": "stop_sequence", "stop_sequence": stop})
        self.assertEqual((res["final"]["stop_reason"], res["final"]["stop_sequence"]), ("stop_sequence", stop))
        self.assertEqual(res["final"]["content"], m["content"])
        # Ended by the token limit: no stop sequence.
        m = self.one({"op": "create", "params": dict(req, stop_sequences=["not in it"])})["response"]
        self.assertEqual((m["stop_reason"], m["stop_sequence"]), ("max_tokens", None))

    def test_count_tokens_is_the_prompt_a_message_reads(self):
        uri = data_uri(7)
        media, data = uri[len("data:"):].split(";base64,")
        req = {"model": "tiny-f32", "system": "Be brief.", "tools": [WEATHER],
               "messages": [{"role": "user", "content": [
                   {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}},
                   {"type": "text", "text": "Weather here?"}]}]}
        n = self.one({"op": "count", "params": req})["response"]
        m = self.one({"op": "create", "params": dict(req, max_tokens=3)})["response"]
        u = m["usage"]
        self.assertEqual(n, {"input_tokens": u["input_tokens"] + u["cache_read_input_tokens"]})
        self.assertGreater(n["input_tokens"], 16)  # the image's soft tokens and the tools' text count
        err = anthropic(self.srv, [{"op": "count", "params": dict(req, messages=[{"role": "bot", "content": "x"}])}])[0]
        self.assertEqual((err["error"]["status"], err["error"]["type"]), (400, "invalid_request_error"))

    def test_tools_and_a_tool_result_turn(self):
        req = {"model": "tiny-f32", "max_tokens": 200, "temperature": 1.0, "tools": [WEATHER],
               "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
               "messages": [{"role": "user", "content": "Weather in Lima?"}]}
        m = self.one({"op": "create", "params": req})["response"]
        self.assertEqual(m["stop_reason"], "tool_use", m)
        uses = [b for b in m["content"] if b["type"] == "tool_use"]
        self.assertEqual(len(uses), 1)
        self.assertRegex(uses[0]["id"], r"^toolu_[A-Za-z0-9]{24}$")
        self.assertEqual(uses[0]["name"], "get_weather")
        jsonschema.Draft202012Validator(WEATHER["input_schema"]).validate(uses[0]["input"])
        # Streamed as it is written, the client assembles the same input from the input_json_delta
        # pieces.
        res = self.one({"op": "stream", "params": dict(req, temperature=0)})
        pieces = [e["delta"]["partial_json"] for e in res["events"]
                  if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta"]
        self.assertGreater(len(pieces), 1)
        self.assertEqual([e["type"] for e in res["events"]][:2], ["message_start", "content_block_start"])
        final_uses = [b for b in res["final"]["content"] if b["type"] == "tool_use"]
        self.assertEqual(json.loads("".join(pieces)), final_uses[0]["input"])
        whole = self.one({"op": "create", "params": dict(req, temperature=0)})["response"]
        self.assertEqual([(b["name"], b["input"]) for b in final_uses],
                         [(b["name"], b["input"]) for b in whole["content"] if b["type"] == "tool_use"])
        # The next turn: the assistant's tool_use, the user's tool_result.
        nxt = {"model": "tiny-f32", "max_tokens": 5, "temperature": 0, "tools": [WEATHER], "messages": [
            {"role": "user", "content": "Weather in Lima?"},
            {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, uses[0]]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0]["id"], "content": "18 C"},
                                         {"type": "text", "text": "Thanks"}]}]}
        self.one({"op": "create", "params": nxt})

    def test_errors_in_anthropic_shape(self):
        base = {"model": "tiny-f32", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
        cases = [
            ("no max_tokens", {"model": "tiny-f32", "messages": [{"role": "user", "content": "Hi"}]}, "max_tokens"),
            ("max_tokens zero", dict(base, max_tokens=0), "max_tokens"),
            ("thinking", dict(base, thinking={"type": "enabled", "budget_tokens": 1024}), "thinking"),
            ("server tool", dict(base, tools=[{"type": "web_search_20250305", "name": "web_search"}]), "tools[0].type"),
            ("bad schema", dict(base, tools=[dict(WEATHER, input_schema={"type": "string", "pattern": "x"})]),
             "tools[0].input_schema"),
            ("bad image", dict(base, messages=[{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]),
             "messages[0].content[0].source"),
            ("document", dict(base, messages=[{"role": "user", "content": [{"type": "document"}]}]),
             "messages[0].content[0].type"),
            ("system role", dict(base, messages=[{"role": "system", "content": "x"}]), "messages[0].role"),
            ("stop sequences", dict(base, stop_sequences=["a", "b", "c", "d", "e"]), "stop_sequences"),
        ]
        for name, body, param in cases:
            with self.subTest(name):
                code, _, r = self.srv.post("/v1/messages", body)
                self.assertEqual(code, 400, r)
                self.assertEqual(r["type"], "error")
                self.assertEqual(r["error"]["type"], "invalid_request_error")
                self.assertIn(param, r["error"]["message"])
                self.assertNotIn("max_completion_tokens", r["error"]["message"])
        res = anthropic(self.srv, [{"op": "create", "params": dict(base, max_tokens=0)}])
        self.assertEqual((res[0]["error"]["name"], res[0]["error"]["type"]), ("BadRequestError", "invalid_request_error"))


@unittest.skipUnless(BIN and FIXTURES, "VLM_BIN and VLM_FIXTURES must be set")
class TestMessagesKey(unittest.TestCase):
    def test_the_x_api_key_header_authenticates(self):
        body = {"model": "tiny-f32", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}
        with Server("tiny-f32", ["--api-key", "sekret"]) as srv:
            ok, bad = anthropic(srv, [{"op": "create", "params": body}], api_key="sekret"), \
                anthropic(srv, [{"op": "create", "params": body}], api_key="wrong")
            self.assertNotIn("error", ok[0], ok)
            self.assertEqual(bad[0]["error"]["name"], "AuthenticationError")
            code, _, _ = srv.post("/v1/messages", body, headers={"x-api-key": "sekret"})
            self.assertEqual(code, 200)


if __name__ == "__main__":
    unittest.main()
