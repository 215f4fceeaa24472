"""response_format json_object / json_schema through the real server, `vlm batch` and `vlm run`.

The judge is independent of our grammar code: Python's json module parses each answer and Debian's
python3-jsonschema (Draft 2020-12) validates it against the schema the client sent. The tiny random
checkpoint writes no JSON of its own accord (checked below), so every valid answer here is the
constraint's doing."""
import json
import os
import subprocess
import tempfile
import threading
import unittest

import jsonschema

from server_util import BIN, Server, chat, model_dir

# A schema in the shape clients send (pydantic's $defs, an optional field as anyOf with null).
CAPTION = {
    "$defs": {"Box": {"type": "object", "properties": {
        "label": {"type": "string", "maxLength": 12},
        "xyxy": {"type": "array", "items": {"type": "integer"}, "minItems": 4, "maxItems": 4}},
        "required": ["label", "xyxy"]}},
    "type": "object",
    "properties": {
        "caption": {"type": "string", "minLength": 1, "maxLength": 40},
        "kind": {"enum": ["photo", "drawing", "chart"]},
        "people": {"type": "integer"},
        "score": {"anyOf": [{"type": "number"}, {"type": "null"}]},
        "boxes": {"type": "array", "items": {"$ref": "#/$defs/Box"}, "maxItems": 2},
        "night": {"type": "boolean"}},
    "required": ["caption", "kind", "people", "score", "boxes", "night"],
    "additionalProperties": False,
}


def schema_format(schema, name="answer"):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def content(resp):
    return resp["choices"][0]["message"]["content"]


class StructuredOutputTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server(args=["--max-seqs", "8"], threads=2)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def post(self, body):
        status, _, resp = self.server.post("/v1/chat/completions", body)
        self.assertEqual(status, 200, resp)
        return resp

    def test_without_a_format_the_model_writes_no_json(self):
        # What makes the tests below able to fail: left alone, this checkpoint's answers are not JSON.
        for seed in range(4):
            text = content(self.post(chat("Describe the picture.", max_tokens=40, temperature=1, seed=seed)))
            with self.assertRaises(ValueError, msg=text):
                json.loads(text)

    def test_json_object_answers_parse_as_objects(self):
        stopped = 0
        for seed in range(8):
            resp = self.post(chat("Describe the picture.", max_tokens=300, temperature=1, seed=seed,
                                  response_format={"type": "json_object"}))
            if resp["choices"][0]["finish_reason"] != "stop":
                continue  # cut by max_tokens: a prefix, as OpenAI's
            stopped += 1
            self.assertIsInstance(json.loads(content(resp)), dict, content(resp))
        self.assertGreaterEqual(stopped, 5)

    def test_json_schema_answers_validate_and_keep_the_schema_order(self):
        validator = jsonschema.Draft202012Validator(CAPTION)
        stopped = 0
        for seed in range(8):
            resp = self.post(chat("Describe the picture.", max_tokens=400, temperature=1, seed=seed,
                                  response_format=schema_format(CAPTION)))
            if resp["choices"][0]["finish_reason"] != "stop":
                continue
            stopped += 1
            value = json.loads(content(resp))
            errors = [e.message for e in validator.iter_errors(value)]
            self.assertEqual(errors, [], content(resp))
            self.assertEqual(list(value), list(CAPTION["properties"]), content(resp))
        self.assertGreaterEqual(stopped, 5)

    def test_greedy_stream_equals_the_whole_answer_and_images_work(self):
        body = chat("What is in the image?", image_seeds=(5,), max_tokens=300,
                    response_format=schema_format(CAPTION))
        whole = self.post(body)
        self.assertEqual(whole["choices"][0]["finish_reason"], "stop")
        jsonschema.validate(json.loads(content(whole)), CAPTION)
        status, events = self.server.events("/v1/chat/completions", dict(body, stream=True))
        self.assertEqual(status, 200)
        chunks = [json.loads(e) for e in events[:-1]]
        streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        self.assertEqual(streamed, content(whole))
        self.assertEqual([c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1], "stop")

    def test_concurrent_mixed_requests_equal_their_solo_runs(self):
        small = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", "y"]}},
                 "required": ["a", "b"]}
        bodies = [chat(f"Question {i}", image_seeds=(i,) if i % 3 == 0 else (), max_tokens=60,
                       response_format=schema_format(small) if i % 2 else {"type": "json_object"} if i % 4 == 0
                       else None)
                  for i in range(8)]
        for b in bodies:
            if b["response_format"] is None:
                del b["response_format"]
        solo = [content(self.post(b)) for b in bodies]
        together = [None] * len(bodies)

        def run(i):
            together[i] = content(self.post(bodies[i]))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(bodies))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(together, solo)
        for b, text in zip(bodies, solo):
            if "response_format" in b and b["response_format"]["type"] == "json_schema":
                jsonschema.validate(json.loads(text), small)

    def test_unsupported_schemas_are_400s_naming_the_keyword(self):
        for schema, word in [({"type": "string", "pattern": "^a+$"}, "'pattern'"),
                             ({"type": "object", "properties": {"d": {"type": "string", "format": "date"}}},
                              "#/properties/d: 'format'"),
                             ({"type": "integer", "minimum": 3}, "'minimum'"),
                             ({"$ref": "https://example.com/x.json"}, "$ref")]:
            status, _, resp = self.server.post("/v1/chat/completions",
                                               chat("Hi", response_format=schema_format(schema)))
            self.assertEqual(status, 400, resp)
            self.assertEqual(resp["error"]["param"], "response_format.json_schema.schema")
            self.assertIn(word, resp["error"]["message"])


class StructuredOutputCliTest(unittest.TestCase):
    def test_batch_and_run_take_the_same_formats(self):
        schema = {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
                  "required": ["n", "ok"]}
        with tempfile.TemporaryDirectory() as d:
            src, out = os.path.join(d, "in.jsonl"), os.path.join(d, "out.jsonl")
            with open(src, "w") as f:
                for i in range(3):
                    f.write(json.dumps({"custom_id": f"r{i}", "body": chat(f"Count {i}", max_tokens=60,
                                                                           response_format=schema_format(schema))})
                            + "\n")
            subprocess.run([BIN, "batch", "--model", model_dir("tiny-f32"), "--input", src, "--output", out,
                            "--threads", "2"], check=True, capture_output=True)
            with open(out) as f:
                lines = [json.loads(line) for line in f]
            self.assertEqual(len(lines), 3)
            schema_file = os.path.join(d, "schema.json")
            with open(schema_file, "w") as f:
                json.dump(schema, f)
            for line, i in zip(lines, range(3)):
                answer = line["response"]["body"]["choices"][0]["message"]["content"]
                jsonschema.validate(json.loads(answer), schema)
                # vlm run --json-schema-file gives the same greedy answer for the same prompt.
                run = subprocess.run([BIN, "run", "--model", model_dir("tiny-f32"), "--threads", "2",
                                      "--prompt", f"Count {i}",
                                      "--max-tokens", "60", "--json-schema-file", schema_file],
                                     check=True, capture_output=True, text=True)
                self.assertEqual(run.stdout.rstrip("\n"), answer)


if __name__ == "__main__":
    unittest.main()
