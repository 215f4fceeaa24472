"""Tool calls (`tools`, `tool_choice`, `parallel_tool_calls`) through the real server, the official
`openai` client and `vlm batch`, in the JSON form of docs/tool-calls.md.

The judges are independent of our grammar code: every call names an offered function and its
arguments, parsed by Python's json, validate against the function's parameters with Debian's
python3-jsonschema (Draft 2020-12). The tiny random checkpoint has no wish to call anything, so
every valid call here is the constraint's doing."""
import json
import os
import subprocess
import tempfile
import unittest

import jsonschema

from server_util import BIN, FIXTURES, SharedServer, chat, openai_client

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now",
    "parameters": {"$defs": {"Unit": {"enum": ["celsius", "fahrenheit"]}},
                   "type": "object",
                   "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 16},
                                  "unit": {"$ref": "#/$defs/Unit"},
                                  "days": {"type": "integer"}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "now", "description": "The time"}}
NO_PARAMS = {"type": "object", "properties": {}, "additionalProperties": False}


def params_of(name):
    return {"get_weather": WEATHER["function"]["parameters"], "now": NO_PARAMS}[name]


@unittest.skipUnless(BIN and FIXTURES, "VLM_BIN and VLM_FIXTURES must be set")
class TestTools(SharedServer):
    SERVER_ARGS = ("--max-seqs", "8")

    def post(self, body):
        code, _, r = self.srv.post("/v1/chat/completions", body)
        self.assertEqual(code, 200, r)
        return r

    def check_calls(self, message, names=("get_weather", "now")):
        calls = message["tool_calls"]
        self.assertGreaterEqual(len(calls), 1)
        self.assertIsNone(message["content"])
        for c in calls:
            self.assertEqual(c["type"], "function")
            self.assertRegex(c["id"], r"^call_[A-Za-z0-9]{24}$")
            self.assertIn(c["function"]["name"], names)
            jsonschema.Draft202012Validator(params_of(c["function"]["name"])).validate(
                json.loads(c["function"]["arguments"]))
        self.assertEqual(len({c["id"] for c in calls}), len(calls))
        return calls

    def test_required_calls_validate_and_stream_the_same(self):
        req = chat("What is the weather in Paris?", max_tokens=200, temperature=1.0, tools=[WEATHER, CLOCK],
                   tool_choice="required")
        for seed in range(4):
            with self.subTest(seed=seed):
                r = self.post(dict(req, seed=seed))
                self.assertEqual(r["choices"][0]["finish_reason"], "tool_calls", r)
                calls = self.check_calls(r["choices"][0]["message"])
                # The same streamed as it is written: each call's first piece with its id and name,
                # then pieces of its arguments; they add up to the whole answer's calls (fresh ids).
                res = openai_client(self.srv, [{"op": "chat", "params": dict(req, seed=seed, stream=True)}])
                self.assertNotIn("error", res[0], res)
                deltas = [c["choices"][0] for c in res[0]["chunks"] if c["choices"]]
                pieces = [t for d in deltas for t in d["delta"].get("tool_calls") or []]
                streamed = []
                for t in pieces:
                    if "id" in t:
                        self.assertEqual(t["index"], len(streamed))
                        self.assertEqual(t["type"], "function")
                        streamed.append({"id": t["id"], "name": t["function"]["name"], "arguments": ""})
                    else:
                        self.assertEqual(set(t), {"index", "function"})
                        self.assertEqual(set(t["function"]), {"arguments"})
                    streamed[t["index"]]["arguments"] += t["function"]["arguments"]
                self.assertEqual([{"name": s["name"], "arguments": s["arguments"]} for s in streamed],
                                 [c["function"] for c in calls])
                self.assertGreater(len(pieces), len(calls), "the arguments come in pieces")
                self.assertEqual([d["finish_reason"] for d in deltas if d["finish_reason"]], ["tool_calls"])
                self.assertEqual(r["choices"][0]["token_ids"],
                                 [t for d in deltas for t in d.get("token_ids") or []])
                # The client's stream helper assembles the same message.
                res = openai_client(self.srv, [{"op": "chat_stream", "params": dict(req, seed=seed)}])
                self.assertNotIn("error", res[0], res)
                final = res[0]["final"]["choices"][0]
                self.assertEqual(final["finish_reason"], "tool_calls")
                self.assertEqual([c["function"] for c in final["message"]["tool_calls"]], [c["function"] for c in calls])

    def test_auto_answers_with_calls_or_text(self):
        req = chat("Hello", max_tokens=200, temperature=1.0, tools=[WEATHER, CLOCK])
        forms = set()
        for seed in range(8):
            c = self.post(dict(req, seed=seed))["choices"][0]
            if c["finish_reason"] == "tool_calls":
                self.check_calls(c["message"])
                forms.add("calls")
            else:
                self.assertNotIn("tool_calls", c["message"])
                self.assertIsInstance(c["message"]["content"], str)
                # A finished answer is the response's text, not the JSON around it.
                if c["finish_reason"] == "stop":
                    self.assertFalse(c["message"]["content"].lstrip().startswith('{"response"'), c)
                forms.add("text")
            # Streamed, the client's helper assembles the same message from the deltas.
            res = openai_client(self.srv, [{"op": "chat_stream", "params": dict(req, seed=seed)}])
            self.assertNotIn("error", res[0], res)
            final = res[0]["final"]["choices"][0]
            self.assertEqual(final["finish_reason"], c["finish_reason"])
            self.assertEqual(final["message"].get("content") or "", c["message"]["content"] or "")
            self.assertEqual([t["function"] for t in final["message"].get("tool_calls") or []],
                             [t["function"] for t in c["message"].get("tool_calls") or []])
        self.assertTrue(forms)

    def test_a_cut_answer_reads_as_far_as_it_goes(self):
        # max_tokens ends the JSON inside the call's arguments: the call so far, as OpenAI's, never
        # the JSON as text; streamed, the same call.
        req = chat("What is the weather in Paris?", max_tokens=200, temperature=1.0, seed=1, tools=[WEATHER],
                   tool_choice="required", parallel_tool_calls=False)
        ids = self.post(req)["choices"][0]["token_ids"]

        def inside_arguments(n):  # the first n tokens end inside the call's arguments
            code, _, r = self.srv.post("/detokenize", {"tokens": ids[:n]})
            self.assertEqual(code, 200, r)
            text = r["prompt"]
            at = text.find('"arguments"')
            start = text.find("{", at + 1)
            if at < 0 or start < 0:
                return False
            try:
                json.JSONDecoder().raw_decode(text[start:])
                return False
            except json.JSONDecodeError:
                return True
        n = next(n for n in range(len(ids) - 1, 0, -1) if inside_arguments(n))
        req["max_tokens"] = n
        c = self.post(req)["choices"][0]
        self.assertEqual(c["finish_reason"], "length")
        self.assertIsNone(c["message"]["content"])
        calls = c["message"]["tool_calls"]
        self.assertEqual([t["function"]["name"] for t in calls], ["get_weather"])
        args = calls[0]["function"]["arguments"]
        self.assertTrue(args.startswith("{"), args)
        with self.assertRaises(json.JSONDecodeError):
            json.loads(args)
        res = openai_client(self.srv, [{"op": "chat", "params": dict(req, stream=True)}])
        self.assertNotIn("error", res[0], res)
        deltas = [ch["choices"][0] for ch in res[0]["chunks"] if ch["choices"]]
        pieces = [t for d in deltas for t in d["delta"].get("tool_calls") or []]
        self.assertEqual(pieces[0]["function"]["name"], "get_weather")
        self.assertEqual("".join(t["function"]["arguments"] for t in pieces), args)
        self.assertEqual([d["finish_reason"] for d in deltas if d["finish_reason"]], ["length"])

    def test_named_function_and_one_call(self):
        named = self.post(chat("Time?", max_tokens=200, temperature=1.0, seed=3, tools=[WEATHER, CLOCK],
                               tool_choice={"type": "function", "function": {"name": "now"}}))
        for c in self.check_calls(named["choices"][0]["message"], names=("now",)):
            self.assertEqual(json.loads(c["function"]["arguments"]), {})
        for seed in range(3):
            one = self.post(chat("Weather?", max_tokens=200, temperature=1.0, seed=seed, tools=[WEATHER],
                                 tool_choice="required", parallel_tool_calls=False))
            self.assertEqual(len(self.check_calls(one["choices"][0]["message"])), 1)

    def test_a_conversation_with_calls_and_results(self):
        first = self.post(chat("Weather in Oslo?", max_tokens=200, temperature=1.0, seed=5, tools=[WEATHER],
                               tool_choice="required", parallel_tool_calls=False))
        msg = first["choices"][0]["message"]
        calls = self.check_calls(msg)
        history = [{"role": "user", "content": "Weather in Oslo?"},
                   {"role": "assistant", "content": None, "tool_calls": calls}]
        history += [{"role": "tool", "tool_call_id": c["id"], "content": "4 degrees, rain"} for c in calls]
        history.append({"role": "user", "content": "So, an umbrella?"})
        body = {"model": "tiny-f32", "messages": history, "tools": [WEATHER], "max_tokens": 30, "temperature": 0}
        self.post(body)  # the next turn runs
        # What the model reads: the call as the JSON it wrote, each result in the user's turn.
        code, _, tok = self.srv.post("/tokenize", dict(body, add_special_tokens=False))
        self.assertEqual(code, 200, tok)
        code, _, text = self.srv.post("/detokenize", {"tokens": tok["tokens"]})
        prompt = text["prompt"]
        wrote = json.dumps({"tool_calls": [{"name": c["function"]["name"],
                                            "arguments": json.loads(c["function"]["arguments"])} for c in calls]},
                           separators=(",", ":"), ensure_ascii=False)
        self.assertIn("<start_of_turn>model\n" + wrote + "<end_of_turn>", prompt)
        result = json.dumps({"tool_response": {"name": "get_weather", "tool_call_id": calls[0]["id"],
                                               "content": "4 degrees, rain"}}, separators=(",", ":"))
        self.assertIn("<start_of_turn>user\n" + result, prompt)
        self.assertIn("So, an umbrella?<end_of_turn>\n<start_of_turn>model\n", prompt)
        self.assertIn('{"name":"get_weather","description":"The weather in a city now"', prompt)

    def test_refusals(self):
        good = chat("Hi", max_tokens=4)
        cases = [
            ("tools not a list", dict(good, tools={"a": 1}), "tools"),
            ("not a function", dict(good, tools=[{"type": "code_interpreter"}]), "tools[0].type"),
            ("bad name", dict(good, tools=[{"type": "function", "function": {"name": "get weather"}}]),
             "tools[0].function.name"),
            ("named twice", dict(good, tools=[CLOCK, CLOCK]), "tools[1].function.name"),
            ("unsupported keyword", dict(good, tools=[{"type": "function", "function": {
                "name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "string",
                                                                                "format": "date"}}}}}]),
             "tools[0].function.parameters"),
            ("unknown function", dict(good, tools=[CLOCK], tool_choice={"type": "function", "function": {"name": "x"}}),
             "tool_choice.function.name"),
            ("tool_choice alone", dict(good, tool_choice="required"), "tool_choice"),
            ("with response_format", dict(good, tools=[CLOCK], response_format={"type": "json_object"}),
             "response_format"),
        ]
        for name, body, param in cases:
            with self.subTest(name):
                code, _, r = self.srv.post("/v1/chat/completions", body)
                self.assertEqual(code, 400, r)
                self.assertEqual(r["error"]["param"], param, r)
        code, _, r = self.srv.post("/v1/completions", {"prompt": "a", "tools": [CLOCK]})
        self.assertEqual((code, r["error"]["param"]), (400, "tools"))
        res = openai_client(self.srv, [{"op": "chat", "params": dict(good, tools=[CLOCK, CLOCK])}])
        self.assertEqual(res[0]["error"]["name"], "BadRequestError")


@unittest.skipUnless(BIN and FIXTURES, "VLM_BIN and VLM_FIXTURES must be set")
class TestBatchTools(unittest.TestCase):
    def test_vlm_batch_answers_with_calls(self):
        req = chat("Weather?", max_tokens=200, temperature=1.0, seed=8, tools=[WEATHER], tool_choice="required")
        with tempfile.TemporaryDirectory() as d:
            inp, out = os.path.join(d, "in.jsonl"), os.path.join(d, "out.jsonl")
            with open(inp, "w") as f:
                f.write(json.dumps({"custom_id": "w", "body": req}) + "\n")
            subprocess.run([BIN, "batch", "--model", os.path.join(FIXTURES, "tiny-f32"), "--input", inp, "--output",
                            out, "--threads", "2"], check=True, capture_output=True, timeout=600)
            with open(out) as f:
                choice = json.loads(f.readline())["response"]["body"]["choices"][0]
        self.assertEqual(choice["finish_reason"], "tool_calls")
        for c in choice["message"]["tool_calls"]:
            self.assertEqual(c["function"]["name"], "get_weather")
            jsonschema.Draft202012Validator(params_of("get_weather")).validate(json.loads(c["function"]["arguments"]))


if __name__ == "__main__":
    unittest.main()
