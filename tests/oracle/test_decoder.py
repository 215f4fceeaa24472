"""`vlm dump` / `vlm run` against the float64 NumPy decoder in text_model.py
(docs/gemma3/merge-and-scaling.md, docs/gemma3/masks.md, docs/gemma3/decoder.md).

Per fixture (tiny and tiny-text, in f32, bf16 and f16) and a 20-token prompt (longer than
the sliding window W = 8), with 32 greedy decode steps (positions up to 51: the sliding
ring of 8 slots wraps six times):
  * inputs_embeds: bit-exact (the oracle reproduces the rounding of the normalizer
    (docs/gemma3/merge-and-scaling.md#text) and of the product in the weight dtype; both are
    single f32 roundings);
  * mask_global / mask_sliding: exact (0.0 or the lowest f32) vs the docs/gemma3/masks.md#sliding text rule;
  * hidden_<i> after every layer, logits at every prompt position, and the logits of every
    decode step: max|ours - oracle| <= TOL * max|oracle| per array, TOL = 1e-5.
    The oracle widens the stored weights exactly and runs in float64, so the only difference
    is our f32 activations/accumulation: measured ~2e-7..8e-7 for all three weight dtypes,
    which is why bf16/f16 need no looser bound than f32;
  * 32 greedy ids identical to the oracle's, which recomputes the whole sequence (no cache)
    for every step.
The decode logits are compared with a full forward over prompt + greedy ids: row n-1+i of a
causal full recomputation is exactly decode step i's query (same visible keys,
docs/gemma3/masks.md#decode, docs/gemma3/decoder.md#kv-cache).

Right padding (--pad-to): greedy ids identical to the unpadded run, valid rows and decode
logits within TOL of it, and no NaN/inf anywhere (pad rows included). Not bitwise: the matmul
picks its kernel path by row count (a row-by-row dot path for small M, packed tiles above), so
13 more rows can change the f32 summation order of every row (measured ~8e-7 relative); a pad
key leaking into a valid row would move it by orders of magnitude more.
Negative checks: an oracle with a wrong attention scale (head_dim^-0.5), the normalizer applied
twice, no sliding window, or the RoPE bases of the two layer kinds swapped disagrees with our
dump far beyond TOL at layer 0, so the hidden-state comparison catches such bugs.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from text_model import TextModel, causal_masks  # noqa: E402

BIN = os.environ.get("VLM_BIN")
FIXTURES = os.environ.get("VLM_FIXTURES")
TOL = 1e-5
STEPS = 32
LOWEST = np.finfo(np.float32).min
# 20 ids: a chat-formatted prompt plus text, all below 262144 (valid in both vocabularies).
PROMPT = [2, 105, 2364, 107, 9259, 236764, 1041, 4799, 563, 12864, 106, 107, 105, 4368, 107,
          818, 3823, 8864, 37423, 38167]
KINDS = ["tiny-f32", "tiny-bf16", "tiny-f16", "tiny-text-f32", "tiny-text-bf16", "tiny-text-f16"]


def run_vlm(*args, check=True):
    # The oracle is exact f32 arithmetic: --precision f32 on every fixture (bf16 ones included).
    args = (args[0], "--precision", "f32", *args[1:]) if args[0] in ("run", "dump") else args
    r = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=600)
    if check and r.returncode != 0:
        raise AssertionError(f"vlm {' '.join(args[:1])} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def dump(model, out, ids=PROMPT, *extra):
    run_vlm("dump", "--model", model, "--tokens", json.dumps(ids), "--out", out,
            "--steps", str(STEPS), "--threads", "2", *extra)
    load = lambda n: np.load(os.path.join(out, n))
    with open(os.path.join(out, "greedy.json")) as f:
        greedy = json.load(f)
    with open(os.path.join(out, "tokens.json")) as f:
        tokens = json.load(f)
    return load, tokens, greedy


def rel_err(ours, ref):
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


@unittest.skipUnless(BIN and FIXTURES, "VLM_BIN and VLM_FIXTURES must be set")
class TestDecoderVsOracle(unittest.TestCase):
    def check_fixture(self, name):
        model = os.path.join(FIXTURES, name)
        m = TextModel(model)
        n, W = len(PROMPT), m.t["sliding_window"]
        self.assertGreater(n, W)
        with tempfile.TemporaryDirectory() as out:
            load, tokens, greedy = dump(model, out)
            self.assertEqual(tokens, PROMPT)
            # Embeddings: exact.
            self.assertTrue(np.array_equal(load("inputs_embeds.npy"), m.embed(PROMPT).astype(np.float32)))
            # Masks: exact, canonical shape.
            glob, slide = causal_masks(n, W)
            for fname, allowed in (("mask_global.npy", glob), ("mask_sliding.npy", slide)):
                mk = load(fname)
                self.assertEqual(mk.shape, (1, 1, n, n))
                self.assertTrue(np.array_equal(mk[0, 0], np.where(allowed, 0.0, LOWEST).astype(np.float32)), fname)
            # Greedy ids from the oracle's own full recomputation at every step.
            self.assertEqual(greedy, m.greedy(PROMPT, STEPS), name)
            # One full forward over prompt + greedy gives every prompt row and decode step.
            hidden, logits = m.forward(m.embed(PROMPT + greedy))
            for i, h in enumerate(hidden):
                e = rel_err(load(f"hidden_{i}.npy"), h[:n])
                self.assertLess(e, TOL, f"{name} hidden_{i}")
            self.assertLess(rel_err(load("logits.npy"), logits[:n]), TOL, f"{name} logits")
            dl = load("decode_logits.npy")
            self.assertEqual(dl.shape, (STEPS, logits.shape[1]))
            for s in range(STEPS):
                self.assertLess(rel_err(dl[s], logits[n + s]), TOL, f"{name} decode step {s}")

    def test_tiny_f32(self):
        self.check_fixture("tiny-f32")

    def test_tiny_bf16(self):
        self.check_fixture("tiny-bf16")

    def test_tiny_f16(self):
        self.check_fixture("tiny-f16")

    def test_tiny_text_f32(self):
        self.check_fixture("tiny-text-f32")

    def test_tiny_text_bf16(self):
        self.check_fixture("tiny-text-bf16")

    def test_tiny_text_f16(self):
        self.check_fixture("tiny-text-f16")


@unittest.skipUnless(BIN and FIXTURES, "VLM_BIN and VLM_FIXTURES must be set")
class TestPadding(unittest.TestCase):
    def check_padding(self, name):
        model = os.path.join(FIXTURES, name)
        n, Lp = len(PROMPT), len(PROMPT) + 13  # 33 rows: past the small-M matmul path
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            la, _, ga = dump(model, a)
            lb, tb, gb = dump(model, b, PROMPT, "--pad-to", str(Lp))
            self.assertEqual(tb, PROMPT)
            self.assertEqual(ga, gb)
            files = sorted(f for f in os.listdir(b) if f.endswith(".npy"))
            for f in files:
                x = lb(f)
                self.assertTrue(np.isfinite(x).all(), f"{f} has NaN/inf")
            mk = lb("mask_global.npy")[0, 0]
            self.assertEqual(mk.shape, (Lp, Lp))
            self.assertTrue((mk[n:, :] == LOWEST).all() and (mk[:, n:] == LOWEST).all())
            for f in files:
                if f.startswith("mask") or f == "decode_logits.npy":
                    continue
                self.assertLess(rel_err(lb(f)[:n], la(f)), TOL, f"{f}: padding changed valid rows")
            self.assertTrue(np.array_equal(lb("inputs_embeds.npy")[:n], la("inputs_embeds.npy")))
            self.assertLess(rel_err(lb("decode_logits.npy"), la("decode_logits.npy")), TOL)

    def test_padding_f32(self):
        self.check_padding("tiny-f32")

    def test_padding_bf16(self):
        self.check_padding("tiny-text-bf16")


@unittest.skipUnless(BIN and FIXTURES, "VLM_BIN and VLM_FIXTURES must be set")
class TestFaultsAreCaught(unittest.TestCase):
    """The comparisons are sensitive: a faulty oracle disagrees with our (correct) dump."""

    @classmethod
    def setUpClass(cls):
        cls.model = os.path.join(FIXTURES, "tiny-bf16")
        cls.tmp = tempfile.TemporaryDirectory()
        dump(cls.model, cls.tmp.name)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def load(self, name):
        return np.load(os.path.join(self.tmp.name, name))

    def test_wrong_attention_scale(self):
        m = TextModel(self.model, faults={"scale_head_dim"})
        hidden, _ = m.forward(m.embed(PROMPT))
        self.assertGreater(rel_err(self.load("hidden_0.npy"), hidden[0]), 100 * TOL)

    def test_double_normalizer(self):
        m = TextModel(self.model, faults={"double_normalizer"})
        e = m.embed(PROMPT)
        self.assertFalse(np.array_equal(self.load("inputs_embeds.npy"), e.astype(np.float32)))
        hidden, _ = m.forward(e)
        self.assertGreater(rel_err(self.load("hidden_0.npy"), hidden[0]), 100 * TOL)

    def test_missing_sliding_window(self):
        m = TextModel(self.model, faults={"no_window"})
        hidden, _ = m.forward(m.embed(PROMPT))
        self.assertGreater(rel_err(self.load("hidden_0.npy"), hidden[0]), 100 * TOL)  # layer 0 slides

    def test_swapped_rope_bases(self):
        m = TextModel(self.model, faults={"swap_rope"})
        hidden, _ = m.forward(m.embed(PROMPT))
        self.assertGreater(rel_err(self.load("hidden_0.npy"), hidden[0]), 100 * TOL)

    def test_correct_oracle_agrees(self):
        m = TextModel(self.model)
        hidden, _ = m.forward(m.embed(PROMPT))
        self.assertLess(rel_err(self.load("hidden_0.npy"), hidden[0]), TOL)


@unittest.skipUnless(BIN and FIXTURES, "VLM_BIN and VLM_FIXTURES must be set")
class TestRunAndErrors(unittest.TestCase):
    def test_run_greedy_matches_oracle(self):
        model = os.path.join(FIXTURES, "tiny-text-f32")
        r = run_vlm("run", "--model", model, "--tokens", json.dumps(PROMPT), "--max-tokens", "6",
                    "--threads", "2", "--ids")
        want = TextModel(model).greedy(PROMPT, 6)
        got = [int(x) for x in r.stdout.split()]
        self.assertEqual(got, want)
        self.assertIn("finish: length", r.stderr)

    def test_prompt_longer_than_context(self):
        model = os.path.join(FIXTURES, "tiny-text-f32")  # max_position_embeddings 1024
        r = run_vlm("run", "--model", model, "--tokens", json.dumps([2] * 1025), check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("exceeds the context limit of 1024", r.stderr)
        self.assertEqual(r.stderr.count("\n"), 1)

    def test_generation_stops_at_context(self):
        model = os.path.join(FIXTURES, "tiny-text-f32")
        r = run_vlm("run", "--model", model, "--tokens", json.dumps(PROMPT), "--max-tokens", "50",
                    "--context", str(len(PROMPT) + 3), "--ids")
        self.assertEqual(len(r.stdout.split()), 4)  # 3 decoded positions + the token after the last
        self.assertIn("finish: length", r.stderr)

    def test_token_outside_vocabulary(self):
        model = os.path.join(FIXTURES, "tiny-text-f32")  # vocab 262144
        r = run_vlm("dump", "--model", model, "--tokens", "[2, 262144]", "--out",
                    tempfile.mkdtemp(), check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("token id 262144 is outside the vocabulary", r.stderr)

    def test_bad_token_list(self):
        model = os.path.join(FIXTURES, "tiny-text-f32")
        r = run_vlm("run", "--model", model, "--tokens", "[2, -1]", check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("--tokens", r.stderr)

    def test_pad_shorter_than_prompt(self):
        model = os.path.join(FIXTURES, "tiny-text-f32")
        r = run_vlm("dump", "--model", model, "--tokens", json.dumps(PROMPT), "--pad-to", "5",
                    "--out", tempfile.mkdtemp(), check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("--pad-to", r.stderr)


if __name__ == "__main__":
    unittest.main()
