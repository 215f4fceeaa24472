"""OpenAI's Responses API (POST /v1/responses) through the official `openai` client: a response is
the answer the same request gives as a chat completion (instructions as the system turn, input
items as messages, images included), streamed through client.responses.stream() (whose checks of
the event order apply) it equals the whole one, function tools and text.format constrain it as on
chat, and what the server does not do (stored responses, built-in tools, reasoning) is refused
naming the Responses field."""
import json
import time
import unittest

import jsonschema

from server_util import BIN, FIXTURES, SharedServer, data_uri, metric, openai_client

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                          "required": ["city"], "additionalProperties": False}}


@unittest.skipUnless(BIN and FIXTURES, "VLM_BIN and VLM_FIXTURES must be set")
class TestResponses(SharedServer):

    def chat(self, body):
        code, _, r = self.srv.post("/v1/chat/completions", body)
        self.assertEqual(code, 200, r)
        return r

    def one(self, job):
        res = openai_client(self.srv, [job])[0]
        self.assertNotIn("error", res, res)
        return res

    def test_a_response_is_the_chat_answer(self):
        image = data_uri(4)
        req = {"model": "tiny-f32", "instructions": "Answer briefly.", "max_output_tokens": 9, "temperature": 0,
               "input": [{"role": "user", "content": [{"type": "input_image", "image_url": image},
                                                      {"type": "input_text", "text": "What is this?"}]}]}
        want = self.chat({"model": "tiny-f32", "max_tokens": 9, "temperature": 0, "messages": [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}},
                                         {"type": "text", "text": "What is this?"}]}]})
        r = self.one({"op": "response", "params": req})["response"]
        self.assertEqual(r["object"], "response")
        self.assertTrue(r["id"].startswith("resp_"))
        self.assertEqual(r["output_text"], want["choices"][0]["message"]["content"])
        self.assertEqual(len(r["output"]), 1)
        msg = r["output"][0]
        self.assertEqual((msg["type"], msg["role"]), ("message", "assistant"))
        self.assertEqual(msg["content"][0]["type"], "output_text")
        finished = want["choices"][0]["finish_reason"]
        self.assertEqual(r["status"], "incomplete" if finished == "length" else "completed")
        if finished == "length":
            self.assertEqual(r["incomplete_details"], {"reason": "max_output_tokens"})
        self.assertEqual(r["usage"]["input_tokens"], want["usage"]["prompt_tokens"])
        self.assertEqual(r["usage"]["output_tokens"], want["usage"]["completion_tokens"])
        self.assertEqual(r["usage"]["total_tokens"], want["usage"]["total_tokens"])
        self.assertEqual(r["instructions"], "Answer briefly.")
        self.assertEqual(r["max_output_tokens"], 9)

        # A string input is one user message.
        r2 = self.one({"op": "response", "params": {"model": "tiny-f32", "input": "Hi", "max_output_tokens": 4,
                                                    "temperature": 0}})["response"]
        w2 = self.chat({"model": "tiny-f32", "max_tokens": 4, "temperature": 0,
                        "messages": [{"role": "user", "content": "Hi"}]})
        self.assertEqual(r2["output_text"], w2["choices"][0]["message"]["content"])

    def test_streamed_through_the_client_helper(self):
        req = {"model": "tiny-f32", "input": "Tell me about rivers", "max_output_tokens": 12, "temperature": 0}
        whole = self.one({"op": "response", "params": req})["response"]
        res = self.one({"op": "response_stream", "params": req})
        events = res["chunks"]
        types = [e["type"] for e in events]
        self.assertEqual(types[:4], ["response.created", "response.in_progress", "response.output_item.added",
                                     "response.content_part.added"])
        self.assertEqual(types[-4:], ["response.output_text.done", "response.content_part.done",
                                      "response.output_item.done",
                                      "response.incomplete" if whole["status"] == "incomplete"
                                      else "response.completed"])
        self.assertTrue(all(t == "response.output_text.delta" for t in types[4:-4]))
        self.assertEqual([e["sequence_number"] for e in events], list(range(len(events))))
        self.assertEqual("".join(e["delta"] for e in events if e["type"] == "response.output_text.delta"),
                         whole["output_text"])
        final = res["final"]
        self.assertEqual(final["output"][0]["content"][0]["text"], whole["output_text"])
        # The last event carries the whole Response (the helper keeps it only for response.completed).
        last = events[-1]["response"]
        cached = last["usage"]["input_tokens_details"]["cached_tokens"]
        self.assertEqual(cached, last["usage"]["input_tokens"])  # the same prompt again: all of it kept
        self.assertEqual((last["status"], last["usage"]),
                         (whole["status"], dict(whole["usage"], input_tokens_details={"cached_tokens": cached})))
        self.assertEqual([dict(o, id=None) for o in last["output"]], [dict(o, id=None) for o in whole["output"]])
        self.assertEqual(last["output"][0]["id"], "msg_" + last["id"][len("resp_"):])

    def test_logprobs_are_the_chat_answers(self):
        """`include: ["message.output_text.logprobs"]` with `top_logprobs`: the output_text's logprobs
        are the chat completion's logprobs.content for the same request; streamed, the deltas' logprobs
        add up to them, and output_text.done and the last event's Response carry them whole."""
        req = {"model": "tiny-f32", "input": "Tell me about lakes", "max_output_tokens": 8, "temperature": 0,
               "include": ["message.output_text.logprobs"], "top_logprobs": 2}
        want = self.chat({"model": "tiny-f32", "max_tokens": 8, "temperature": 0, "logprobs": True, "top_logprobs": 2,
                          "messages": [{"role": "user", "content": "Tell me about lakes"}]})
        want_lp = want["choices"][0]["logprobs"]["content"]
        self.assertEqual(len(want_lp), 8)

        def same(got):
            self.assertEqual([t["token"] for t in got], [t["token"] for t in want_lp])
            for g, w in zip(got, want_lp):
                self.assertEqual(g["bytes"], w["bytes"])
                self.assertAlmostEqual(g["logprob"], w["logprob"], delta=1e-6)
                self.assertEqual([t["token"] for t in g["top_logprobs"]], [t["token"] for t in w["top_logprobs"]])

        r = self.one({"op": "response", "params": req})["response"]
        self.assertEqual(r["top_logprobs"], 2)
        same(r["output"][0]["content"][0]["logprobs"])
        res = self.one({"op": "response_stream", "params": req})
        deltas = [e for e in res["chunks"] if e["type"] == "response.output_text.delta"]
        same([t for e in deltas for t in e["logprobs"]])
        done = next(e for e in res["chunks"] if e["type"] == "response.output_text.done")
        same(done["logprobs"])
        same(res["chunks"][-1]["response"]["output"][0]["content"][0]["logprobs"])  # the helper's final keeps none
        # top_logprobs alone asks for them too; neither: none.
        alone = self.one({"op": "response", "params": dict(req, include=[], top_logprobs=0)})["response"]
        self.assertEqual([t["token"] for t in alone["output"][0]["content"][0]["logprobs"]], [t["token"] for t in want_lp])
        self.assertEqual({len(t["top_logprobs"]) for t in alone["output"][0]["content"][0]["logprobs"]}, {0})
        plain = dict(req)
        del plain["include"], plain["top_logprobs"]
        self.assertEqual(self.one({"op": "response", "params": plain})["response"]["output"][0]["content"][0]["logprobs"], [])

    def test_function_tools_and_a_second_turn(self):
        req = {"model": "tiny-f32", "input": "Weather in Rome?", "tools": [WEATHER], "tool_choice": "required",
               "parallel_tool_calls": False, "max_output_tokens": 200, "temperature": 1.0, "seed": 2}
        r = self.one({"op": "response", "params": req})["response"]
        self.assertEqual(r["status"], "completed", r)
        calls = [o for o in r["output"] if o["type"] == "function_call"]
        self.assertEqual(len(calls), 1)
        call = calls[0]
        self.assertEqual(call["name"], "get_weather")
        self.assertRegex(call["call_id"], r"^call_[A-Za-z0-9]{24}$")
        jsonschema.Draft202012Validator(WEATHER["parameters"]).validate(json.loads(call["arguments"]))
        # Streamed as it is written: the call's item, its arguments in pieces, done.
        res = self.one({"op": "response_stream", "params": req})
        types = [e["type"] for e in res["chunks"]]
        pieces = [e["delta"] for e in res["chunks"] if e["type"] == "response.function_call_arguments.delta"]
        self.assertGreater(len(pieces), 1)
        self.assertEqual("".join(pieces), call["arguments"])
        self.assertLess(types.index("response.output_item.added"), types.index("response.function_call_arguments.delta"))
        self.assertLess(types.index("response.function_call_arguments.done"), types.index("response.output_item.done"))
        final_calls = [o for o in res["final"]["output"] if o["type"] == "function_call"]
        self.assertEqual([(c["name"], c["arguments"]) for c in final_calls], [(call["name"], call["arguments"])])
        # The next turn sends the call and its output back as items.
        nxt = {"model": "tiny-f32", "tools": [WEATHER], "max_output_tokens": 5, "temperature": 0, "input": [
            {"role": "user", "content": "Weather in Rome?"},
            {"type": "function_call", "call_id": call["call_id"], "name": call["name"], "arguments": call["arguments"]},
            {"type": "function_call_output", "call_id": call["call_id"], "output": "21 C, sunny"}]}
        self.one({"op": "response", "params": nxt})
        code, _, tok = self.srv.post("/tokenize", {"model": "tiny-f32", "add_special_tokens": False, "messages": [
            {"role": "user", "content": "Weather in Rome?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": call["call_id"], "type": "function", "function": {
                "name": call["name"], "arguments": call["arguments"]}}]},
            {"role": "tool", "tool_call_id": call["call_id"], "content": "21 C, sunny"}]})
        self.assertEqual(code, 200, tok)

    def test_text_format_json_schema(self):
        schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 20},
                                                   "sure": {"type": "boolean"}},
                  "required": ["answer", "sure"], "additionalProperties": False}
        r = self.one({"op": "response", "params": {
            "model": "tiny-f32", "input": "Is the sky blue?", "max_output_tokens": 200, "temperature": 1.0,
            "seed": 5, "text": {"format": {"type": "json_schema", "name": "verdict", "schema": schema,
                                           "strict": True}}}})["response"]
        self.assertEqual(r["status"], "completed", r)
        jsonschema.Draft202012Validator(schema).validate(json.loads(r["output_text"]))
        self.assertEqual(r["text"]["format"]["name"], "verdict")

    def test_refusals_name_the_responses_field(self):
        base = {"model": "tiny-f32", "input": "Hi", "max_output_tokens": 4}
        cases = [
            ("stored responses", dict(base, previous_response_id="resp_1"), "previous_response_id"),
            ("background", dict(base, background=True), "background"),
            ("include", dict(base, include=["message.output_text.logprobs", "reasoning.encrypted_content"]),
             "include[1]"),
            ("top_logprobs", dict(base, top_logprobs=21), "top_logprobs"),
            ("reasoning", dict(base, reasoning={"effort": "high"}), "reasoning"),
            ("truncation auto", dict(base, truncation="auto"), "truncation"),
            ("no input", {"model": "tiny-f32"}, "input"),
            ("item reference", dict(base, input=[{"type": "item_reference", "id": "msg_1"}]), "input[0].type"),
            ("built-in tool", dict(base, tools=[{"type": "web_search"}]), "tools[0].type"),
            ("file part", dict(base, input=[{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]),
             "input[0].content[0].type"),
            ("bad image", dict(base, input=[{"role": "user", "content": [
                {"type": "input_text", "text": "x"},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]), "input[0].content[1].image_url"),
            ("missing content", dict(base, input=[{"role": "user"}]), "input[0].content"),
            ("max_output_tokens", dict(base, max_output_tokens=0), "max_output_tokens"),
            ("schema keyword", dict(base, text={"format": {"type": "json_schema", "name": "x", "schema": {
                "type": "string", "format": "date"}}}), "text.format.schema"),
            ("tool name", dict(base, tools=[dict(WEATHER, name="get weather")]), "tools[0].name"),
            ("instructions type", dict(base, instructions=5), "instructions"),
        ]
        for name, body, param in cases:
            with self.subTest(name):
                code, _, r = self.srv.post("/v1/responses", body)
                self.assertEqual(code, 400, r)
                self.assertEqual(r["error"]["param"], param, r)
                for chat_name in ("messages[", "'messages'", "max_completion_tokens", "response_format", "].function"):
                    self.assertNotIn(chat_name, r["error"]["message"])  # the chat request is ours, not the client's
        res = openai_client(self.srv, [{"op": "response", "params": dict(base, previous_response_id="resp_1")}])
        self.assertEqual(res[0]["error"]["name"], "BadRequestError")

    def test_a_client_that_leaves_cancels_the_response(self):
        before = self.srv.metrics()
        res = openai_client(self.srv, [{"op": "response", "params": {
            "model": "tiny-f32", "input": "Write a long story", "max_output_tokens": 500, "temperature": 1.0,
            "stream": True}, "abort_after": 3}])
        self.assertTrue(res[0].get("aborted"), res)
        deadline = time.time() + 30
        while time.time() < deadline:
            m = self.srv.metrics()
            if metric(m, "vlm:num_requests_running") == 0:
                break
            time.sleep(0.05)
        self.assertEqual(metric(m, "vlm:requests_cancelled_total", 0) - metric(before, "vlm:requests_cancelled_total", 0),
                         1)


if __name__ == "__main__":
    unittest.main()
