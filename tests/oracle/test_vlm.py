"""Gemma 3 VLM end to end (issue 6): `vlm dump`/`vlm run` with images against the oracle.

The oracle: prompt ids from HF's processor string (docs/gemma3/prompt.md FULL substitution, mm_model.py)
tokenized by `vlm tokenize --parse-special` (the tokenizer itself is proven against the npm
reference in tests/e2e), pixel values from PIL (preprocess.py), tower + projector in float64
(vision_model.py), masks from docs/gemma3/masks.md (mm_model.py), the decoder in float64 (text_model.py).

Tolerances (stated once):
  * masks, prompt ids, image positions, text rows of inputs_embeds: exact;
  * image rows of inputs_embeds: max abs <= ATOL = 2e-5 (the vision test's bound: our f32 tower
    against the float64 oracle, values up to ~4);
  * embed_norms: relative 1e-5 per row against the norms of the oracle's merged rows;
  * hidden states after every layer, logits at every valid position, decode logits:
    max|ours - oracle| <= TOL * max|oracle|, TOL = 1e-5 (measured <= 6.7e-7 on tiny-f32 and
    tiny-bf16, one and two images, hf and mlx modes: the image rows' f32 tower error and our f32
    decoder together stay far below it);
  * 32 greedy ids: each equals the oracle's argmax (ids < image_token_id) at its position of a
    full float64 recomputation over prompt + greedy ids with the prompt block masked as in the
    prefill and causal rows after it (docs/gemma3/masks.md#decode); by induction the oracle's own
    greedy run is ours.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mm_model  # noqa: E402
import preprocess  # noqa: E402
import vision_model  # noqa: E402
from text_model import TextModel  # noqa: E402

BIN = os.environ.get("VLM_BIN")
FIXTURES = os.environ.get("VLM_FIXTURES")
IMAGE_ID, BOI, EOI = 262144, 255999, 256000
T = 16  # mm_tokens_per_image of the tiny preset
ATOL, TOL, STEPS = 2e-5, 1e-5, 32
LOWEST = np.finfo(np.float32).min
QUESTION = "What is in this picture?"


def vlm(*args, env=None, check=True):
    e = dict(os.environ)
    e.pop("VLM_FAULT", None)
    e.update(env or {})
    # The oracle is exact f32 arithmetic: --precision f32 on every fixture (bf16 ones included).
    args = (args[0], "--precision", "f32", *args[1:]) if args[0] in ("run", "dump") else args
    r = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=600, env=e)
    if check and r.returncode != 0:
        raise AssertionError(f"vlm {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@unittest.skipUnless(BIN and FIXTURES, "VLM_BIN and VLM_FIXTURES must be set")
class TestVlm(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="vlm_mm_")
        rng = np.random.default_rng(7)
        cls.images = []
        for i, (w, h) in enumerate([(80, 60), (45, 70)]):
            p = os.path.join(cls.tmp, f"img{i}.png")
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(p)
            cls.images.append(p)
        cls.models, cls.feats = {}, {}

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def model(self, name):
        return os.path.join(FIXTURES, name)

    def tm(self, name):
        if name not in self.models:
            self.models[name] = TextModel(self.model(name))
        return self.models[name]

    def oracle_feats(self, name, k):
        """Projector rows [k·T, H] of the first k images, float64, from PIL pixels."""
        if (name, k) not in self.feats:
            pv, _ = preprocess.pixel_values(self.images[:k], size=64)
            _, f = vision_model.encode(self.model(name), pv)
            self.feats[(name, k)] = f.reshape(-1, f.shape[-1])
        return self.feats[(name, k)]

    def dump(self, name, k, *extra, env=None, steps=0, prompt=QUESTION):
        out = tempfile.mkdtemp(dir=self.tmp)
        args = ["dump", "--model", self.model(name), "--out", out, "--steps", str(steps), "--threads", "2"]
        if prompt is not None:
            args += ["--prompt", prompt]
        for p in self.images[:k]:
            args += ["--image", p]
        vlm(*args, *extra, env=env)

        def load(n):
            path = os.path.join(out, n)
            if n.endswith(".json"):
                with open(path) as f:
                    return json.load(f)
            return np.load(path)
        load.out = out
        return load

    def hf_ids(self, name, k, text=QUESTION):
        s = mm_model.hf_prompt_string(k, text, T)
        return json.loads(vlm("tokenize", "--model", self.model(name), "--parse-special", s).stdout)

    # ---- prompt ids and image positions (docs/gemma3/prompt.md#image-expansion) ----
    def test_ids_and_positions(self):
        for k in (1, 2):
            d = self.dump("tiny-f32", k)
            ids = d("tokens.json")
            self.assertEqual(ids, self.hf_ids("tiny-f32", k))
            pos = [i for i, t in enumerate(ids) if t == IMAGE_ID]
            self.assertEqual(d("image_positions.json"), pos)
            self.assertEqual(len(pos), k * T)
            # docs/gemma3/prompt.md#image-expansion layout: "user\n" + "\n\n" merge into 2364, 109;
            # EOI then "\n\n" = 108; two
            # adjacent images: EOI, 110 ("\n\n\n\n"), BOI.
            self.assertEqual(ids[:5], [2, 105, 2364, 109, BOI])
            self.assertEqual(ids[5:5 + T], [IMAGE_ID] * T)
            self.assertEqual(ids[-5:], [106, 107, 105, 4368, 107])
            if k == 1:
                self.assertEqual(ids[5 + T:7 + T], [EOI, 108])
            else:
                self.assertEqual(ids[5 + T:8 + T], [EOI, 110, BOI])
        # --raw: HF's processor on the text itself, each "<start_of_image>" an image slot.
        ids = self.dump("tiny-f32", 1, "--raw", prompt="<start_of_image>Describe")("tokens.json")
        full = "\n\n<start_of_image>" + "<image_soft_token>" * T + "<end_of_image>\n\n"
        self.assertEqual(ids, json.loads(vlm("tokenize", "--model", self.model("tiny-f32"), "--parse-special",
                                             "<bos>" + full + "Describe").stdout))
        # Google token splice (docs/gemma3/prompt.md#layouts): 107, then [108, BOI, soft×T, EOI, 108].
        ids = self.dump("tiny-f32", 1, "--layout", "google")("tokens.json")
        self.assertEqual(ids[:6], [2, 105, 2364, 107, 108, BOI])
        self.assertEqual(ids[6 + T:8 + T], [EOI, 108])

    def test_messages_any_placement(self):
        msgs = [{"role": "user", "content": [{"type": "text", "text": "First"}, {"type": "image"},
                                             {"type": "text", "text": "then"}, {"type": "image"}]}]
        path = os.path.join(self.tmp, "msgs.json")
        with open(path, "w") as f:
            json.dump(msgs, f)
        d = self.dump("tiny-f32", 2, "--messages", path, prompt=None)
        s = "<bos><start_of_turn>user\nFirst<start_of_image>then<start_of_image><end_of_turn>\n<start_of_turn>model\n"
        full = "\n\n<start_of_image>" + "<image_soft_token>" * T + "<end_of_image>\n\n"
        want = json.loads(vlm("tokenize", "--model", self.model("tiny-f32"), "--parse-special",
                              s.replace("<start_of_image>", full)).stdout)
        self.assertEqual(d("tokens.json"), want)

    # ---- masks: every cell, every mode, 1 and 2 images, with and without right padding ----
    def test_masks_exact(self):
        W = self.tm("tiny-f32").t["sliding_window"]
        for k in (1, 2):
            for pad in (0, 7):
                for mode in ("hf", "mlx", "causal"):
                    extra = ["--mask-mode", mode]
                    n = len(self.hf_ids("tiny-f32", k)) if pad else 0
                    if pad:
                        extra += ["--pad-to", str(n + pad)]
                    d = self.dump("tiny-f32", k, *extra)
                    ids = d("tokens.json")
                    Lp = len(ids) + pad
                    g, s = mm_model.mask_allowed(mode, ids, len(ids), Lp, W, IMAGE_ID)
                    with self.subTest(images=k, pad=pad, mode=mode):
                        mg, ms = d("mask_global.npy"), d("mask_sliding.npy")
                        self.assertEqual(mg.shape, (1, 1, Lp, Lp))
                        np.testing.assert_array_equal(mg[0, 0], mm_model.additive(g))
                        np.testing.assert_array_equal(ms[0, 0], mm_model.additive(s))
                        if mode == "mlx" and not pad:  # the all-valid mask
                            self.assertTrue((mg == 0).all())
                        if pad:  # padded rows and columns blocked
                            self.assertTrue((mg[0, 0, len(ids):, :] == LOWEST).all())
                            self.assertTrue((mg[0, 0, :, len(ids):] == LOWEST).all())
                        if mode == "hf":  # an image token sees the last token of its block
                            first = ids.index(IMAGE_ID)
                            self.assertEqual(mg[0, 0, first, first + T - 1], 0.0)
                            self.assertEqual(ms[0, 0, first, first + T - 1], 0.0)  # window after the OR

    def test_vlm_default_mask_is_hf_text_default_causal(self):
        d = self.dump("tiny-bf16", 1)
        self.assertEqual(d("identity.json")["fields"]["mask_mode"], "hf")
        ids = d("tokens.json")
        g, _ = mm_model.mask_allowed("hf", ids, len(ids), len(ids), 8, IMAGE_ID)
        np.testing.assert_array_equal(d("mask_global.npy")[0, 0], mm_model.additive(g))
        d = self.dump("tiny-text-f32", 0)
        self.assertEqual(d("identity.json")["fields"]["mask_mode"], "causal")

    # ---- merged rows, norms, layers, logits, greedy ----
    def check_against_oracle(self, name, k, mode="hf"):
        tm = self.tm(name)
        W = tm.t["sliding_window"]
        d = self.dump(name, k, "--mask-mode", mode, steps=STEPS)
        ids = d("tokens.json")
        n = len(ids)
        feats = self.oracle_feats(name, k)
        rows, pos = mm_model.merge(tm, ids, feats, IMAGE_ID)
        emb = d("inputs_embeds.npy")
        text = np.setdiff1d(np.arange(n), pos)
        np.testing.assert_array_equal(emb[text], rows[text].astype(np.float32))
        self.assertLessEqual(np.abs(emb[pos] - rows[pos]).max(), ATOL)
        norms = d("embed_norms.npy")
        self.assertEqual(norms.shape, (n,))
        want = np.linalg.norm(rows, axis=1)
        self.assertLessEqual(float(np.abs(norms / want - 1).max()), 1e-5)
        # Text rows are ‖E‖·normalizer up to the one rounding of the product
        # (docs/gemma3/merge-and-scaling.md#text).
        e_norm = np.linalg.norm(tm.E[np.asarray(ids)[text]], axis=1) * tm.normalizer()
        self.assertLessEqual(float(np.abs(norms[text] / e_norm - 1).max()),
                             2 ** -8 if tm.embed_dtype == "BF16" else 1e-6)

        g, s = mm_model.mask_allowed(mode, ids, n, n, W, IMAGE_ID)
        hidden, logits = tm.forward(rows, masks=(g, s))
        for i, h in enumerate(hidden):
            self.assertLessEqual(rel(d(f"hidden_{i}.npy"), h), TOL, f"{name} hidden_{i}")
        self.assertLessEqual(rel(d("logits.npy"), logits), TOL, f"{name} logits")

        greedy = d("greedy.json")
        self.assertEqual(len(greedy), STEPS)
        total = n + STEPS
        full = tm.embed(ids + greedy)
        full[:n] = rows
        masks = (mm_model.extend_for_decode(g, total, W, False), mm_model.extend_for_decode(s, total, W, True))
        _, lg = tm.forward(full, masks=masks, head_rows=list(range(n - 1, total)))
        lim = tm.sample_limit()
        self.assertEqual(greedy, [int(np.argmax(r[:lim])) for r in lg[:STEPS]], name)
        self.assertLessEqual(rel(d("decode_logits.npy")[:STEPS - 1], lg[1:STEPS]), TOL, f"{name} decode")
        return d, greedy

    def test_tiny_f32_one_image(self):
        self.check_against_oracle("tiny-f32", 1)

    def test_tiny_bf16_two_images(self):
        self.check_against_oracle("tiny-bf16", 2)

    def test_mlx_mode_against_oracle(self):
        self.check_against_oracle("tiny-f32", 1, mode="mlx")

    def test_right_padding_same_result(self):
        d0 = self.dump("tiny-bf16", 1, steps=8)
        n = len(d0("tokens.json"))
        d1 = self.dump("tiny-bf16", 1, "--pad-to", str(n + 9), steps=8)
        self.assertEqual(d0("greedy.json"), d1("greedy.json"))
        self.assertLessEqual(rel(d1("logits.npy")[:n], d0("logits.npy")), 1e-5)
        self.assertTrue(np.isfinite(d1("logits.npy")).all())

    # ---- mask routing ----
    def test_mask_routing(self):
        """Blocking one allowed cell (q, k) reaches every prefill layer: our hidden states
        match an oracle with the cell blocked in all layers, and for each layer L they do
        not match an oracle that blocks it everywhere except L. Decode then sees the prefill
        only through the cache: its logits match the full recomputation whose decode rows
        are plain causal."""
        name = "tiny-f32"
        tm = self.tm(name)
        W = tm.t["sliding_window"]
        d0 = self.dump(name, 1, steps=4)
        ids = d0("tokens.json")
        n = len(ids)
        q, k = n - 3, n - 5  # text query and key inside the window: allowed in both masks
        d = self.dump(name, 1, "--block-cell", str(q), str(k), steps=4)
        rows, _ = mm_model.merge(tm, ids, self.oracle_feats(name, 1), IMAGE_ID)
        g, s = mm_model.mask_allowed("hf", ids, n, n, W, IMAGE_ID)
        self.assertTrue(g[q, k] and s[q, k])
        gb, sb = g.copy(), s.copy()
        gb[q, k] = sb[q, k] = False

        class PerLayer:
            """Masks indexed like TextModel.forward does (one lookup per layer, in order)."""
            def __init__(self, per_layer):
                self.it = iter(per_layer)

            def __getitem__(self, kind_index):
                return next(self.it)[kind_index]

        kinds = tm.t["layer_kinds"]
        hidden, _ = tm.forward(rows, masks=(gb, sb))
        for i, h in enumerate(hidden):
            ours = d(f"hidden_{i}.npy")
            self.assertLessEqual(rel(ours, h), TOL, f"hidden_{i} with the cell blocked")
            per = [(g, s) if j == i else (gb, sb) for j in range(len(kinds))]
            h_open, _ = tm.forward(rows, masks=PerLayer(per))
            gap = float(np.abs(ours[q] - h_open[i][q]).max() / np.abs(h_open[i]).max())
            self.assertGreater(gap, 100 * TOL, f"layer {i} ({kinds[i]}) ignored the external mask")
            # Rows before q cannot see the change.
            self.assertLessEqual(rel(ours[:q], d0(f"hidden_{i}.npy")[:q]), 1e-6)
        greedy = d("greedy.json")
        total = n + len(greedy)
        full = tm.embed(ids + greedy)
        full[:n] = rows
        masks = (mm_model.extend_for_decode(gb, total, W, False), mm_model.extend_for_decode(sb, total, W, True))
        _, lg = tm.forward(full, masks=masks, head_rows=list(range(n, total)))
        self.assertLessEqual(rel(d("decode_logits.npy")[:len(greedy)], lg), TOL)

    # ---- negative fixtures: each fault caught by an intermediate ----
    def test_faults_caught_by_intermediates(self):
        name = "tiny-f32"
        tm = self.tm(name)
        feats = self.oracle_feats(name, 1)

        def norms_ok(d):
            ids = d("tokens.json")
            rows, _ = mm_model.merge(tm, ids, feats, IMAGE_ID)
            return float(np.abs(d("embed_norms.npy") / np.linalg.norm(rows, axis=1) - 1).max()) <= 1e-5

        def mask_ok(d):
            ids = d("tokens.json")
            g, s = mm_model.mask_allowed("hf", ids, len(ids), len(ids), 8, IMAGE_ID)
            return (np.array_equal(d("mask_global.npy")[0, 0], mm_model.additive(g))
                    and np.array_equal(d("mask_sliding.npy")[0, 0], mm_model.additive(s)))

        clean = self.dump(name, 1)
        self.assertTrue(norms_ok(clean) and mask_ok(clean))
        mlx = self.dump(name, 1, "--image-scaling", "mlx")
        self.assertTrue(norms_ok(mlx), "the mlx order of scaling reaches the reference magnitude")
        for fault, extra, check in [("causal_mask", [], mask_ok), ("multiplicative_mask", [], mask_ok),
                                    ("double_scale", [], norms_ok),
                                    ("no_image_prescale", ["--image-scaling", "mlx"], norms_ok)]:
            with self.subTest(fault=fault):
                d = self.dump(name, 1, *extra, env={"VLM_FAULT": fault})
                self.assertFalse(check(d), f"{fault} not caught")
        d = self.dump(name, 1, "--image-scaling", "mlx", env={"VLM_FAULT": "no_image_prescale"})
        ids = d("tokens.json")
        pos = [i for i, t in enumerate(ids) if t == IMAGE_ID]
        ratio = d("embed_norms.npy")[pos] / np.linalg.norm(feats, axis=1)
        np.testing.assert_allclose(ratio, tm.normalizer(), rtol=1e-5)  # net scale √H, not 1

    # ---- errors before compute, fallbacks ----
    def test_placeholder_mismatch(self):
        msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "x"}]}]
        path = os.path.join(self.tmp, "two.json")
        with open(path, "w") as f:
            json.dump(msgs, f)
        r = vlm("run", "--model", self.model("tiny-f32"), "--messages", path, "--image", self.images[0],
                check=False)
        self.assertEqual(r.returncode, 1)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertIn("2", r.stderr)
        self.assertIn("1", r.stderr)
        ids = [2, 105, 2364, 107, BOI] + [IMAGE_ID] * 3 + [EOI, 106, 107, 105, 4368, 107]
        r = vlm("run", "--model", self.model("tiny-f32"), "--tokens", json.dumps(ids), "--image", self.images[0],
                "--ids", check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("3 image soft tokens", r.stderr)
        self.assertIn("need 16", r.stderr)

    def test_bad_inputs_one_line_errors(self):
        bad = os.path.join(self.tmp, "bad.json")
        with open(bad, "w") as f:
            f.write('[{"role": "user"}]')
        m, img = self.model("tiny-f32"), self.images[0]
        for args, want in [(["--model", m, "--prompt", "x", "--mask-mode", "foo"], "unknown mask mode 'foo'"),
                           (["--model", m, "--prompt", "x", "--image-scaling", "foo"], "unknown image scaling 'foo'"),
                           (["--model", m, "--prompt", "x", "--layout", "foo"], "--layout"),
                           (["--model", self.model("tiny-text-f32"), "--prompt", "x", "--image", img],
                            "text-only checkpoint"),
                           (["--model", m, "--prompt", "x", "--image", bad], bad),
                           (["--model", m, "--messages", bad], "messages[0].content"),
                           (["--model", m, "--messages", bad + ".missing"], "cannot read"),
                           (["--model", m, "--messages", bad, "--prompt", "x"], "exactly one of")]:
            r = vlm("run", *args, check=False)
            with self.subTest(args=args):
                self.assertEqual(r.returncode, 1)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                self.assertIn(want, r.stderr)

    def test_context_overflow(self):
        r = vlm("run", "--model", self.model("tiny-f32"), "--image", self.images[0], "--image", self.images[1],
                "--prompt", "hi", "--context", "40", check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("exceeds the context limit of 40", r.stderr)
        self.assertIn("32 of them image tokens", r.stderr)

    def test_no_image_fallback_never_runs_vision(self):
        """A text request on a VLM whose vision weights are all NaN gives the tokens of the
        intact folder (and of the plain token path), through the text path's causal masks;
        an image request on that folder does read them (NaN features)."""
        src = self.model("tiny-old-sharded")
        broken = os.path.join(self.tmp, "nan-vision")
        os.makedirs(broken, exist_ok=True)
        with open(os.path.join(src, "model.safetensors.index.json")) as f:
            idx = json.load(f)["weight_map"]
        vision_shards = {v for key, v in idx.items() if key.startswith(("vision_tower", "multi_modal"))}
        text_shards = {v for key, v in idx.items() if key.startswith("language_model")}
        self.assertTrue(vision_shards and not vision_shards & text_shards)
        for f in os.listdir(src):
            dst = os.path.join(broken, f)
            if os.path.exists(dst):
                continue
            if f in vision_shards:
                with open(os.path.join(src, f), "rb") as fh:
                    data = bytearray(fh.read())
                start = 8 + int.from_bytes(data[:8], "little")
                data[start:] = b"\xff" * (len(data) - start)  # every bf16 value a NaN
                with open(dst, "wb") as fh:
                    fh.write(data)
            else:
                os.symlink(os.path.join(src, f), dst)
        args = ["--prompt", "Tell me a story", "--ids", "--max-tokens", "12", "--threads", "2"]
        want = vlm("run", "--model", src, *args).stdout
        self.assertEqual(vlm("run", "--model", broken, *args).stdout, want)
        toks = json.loads(vlm("tokenize", "--model", src, "--chat",
                              json.dumps([{"role": "user", "content": "Tell me a story"}])).stdout)
        text_path = vlm("run", "--model", src, "--tokens", json.dumps(toks), "--ids", "--max-tokens", "12",
                        "--threads", "2").stdout
        self.assertEqual(text_path, want)
        out = os.path.join(self.tmp, "nan-dump")
        vlm("dump", "--model", broken, "--prompt", "x", "--image", self.images[0], "--out", out, "--steps", "0")
        self.assertTrue(np.isnan(np.load(os.path.join(out, "image_features.npy"))).any())
        d = self.dump("tiny-f32", 0, prompt="Tell me a story")
        n = len(d("tokens.json"))
        g, s = mm_model.mask_allowed("causal", d("tokens.json"), n, n, 8, IMAGE_ID)
        np.testing.assert_array_equal(d("mask_global.npy")[0, 0], mm_model.additive(g))
        np.testing.assert_array_equal(d("mask_sliding.npy")[0, 0], mm_model.additive(s))
        self.assertFalse(os.path.exists(os.path.join(d.out, "image_positions.json")))

    def test_run_streams_answer_with_image(self):
        r = vlm("run", "--model", self.model("tiny-bf16"), "--image", self.images[0], "--prompt", QUESTION,
                "--max-tokens", "6", "--ids", "--threads", "2")
        want = self.dump("tiny-bf16", 1, steps=6)("greedy.json")
        got = [int(x) for x in r.stdout.split()]
        self.assertEqual(got, want[:len(got)])  # run stops early only at an eos id
        self.assertIn("prompt tokens", r.stderr)

    # ---- identity ----
    def test_identity_refusal(self):
        d = self.dump("tiny-f32", 1)
        ident = d("identity.json")
        self.assertEqual(ident["fields"]["mask_mode"], "hf")
        self.assertEqual(len(ident["hash"]), 16)
        path = os.path.join(self.tmp, "identity.json")
        with open(path, "w") as f:
            json.dump(ident, f)
        self.dump("tiny-f32", 1, "--check-identity", path)  # same identity: accepted
        for model, extra, fields in [("tiny-f32", ["--mask-mode", "mlx"], ["mask_mode"]),
                                     ("tiny-bf16", [], ["weight_dtypes", "scaling_policy"]),
                                     ("tiny-f32", ["--image-scaling", "mlx"], ["scaling_policy"])]:
            r = vlm("dump", "--model", self.model(model), "--prompt", "x", "--out", os.path.join(self.tmp, "refused"),
                    "--steps", "0", "--check-identity", path, *extra, check=False)
            with self.subTest(model=model, extra=extra):
                self.assertEqual(r.returncode, 1)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                self.assertIn("another model identity", r.stderr)
                for fld in fields:
                    self.assertIn(fld, r.stderr)

    def test_prompt_cache_keyed_by_identity(self):
        """`vlm run --prompt-cache`: a saved prefill is reused for the same request under the same
        identity (same tokens as computing it), recomputed for another image, and refused with
        the differing fields named under another mask mode or checkpoint."""
        cache = os.path.join(self.tmp, "prompt.cache")
        args = ["--prompt", QUESTION, "--ids", "--max-tokens", "16", "--threads", "2", "--temperature", "1.5",
                "--seed", "3"]

        def run(model, image, *extra, check=True):
            return vlm("run", "--model", self.model(model), "--image", image, *args, *extra, check=check)
        plain = run("tiny-bf16", self.images[0]).stdout
        first = run("tiny-bf16", self.images[0], "--prompt-cache", cache)
        self.assertNotIn("prompt cache: reusing", first.stderr)
        self.assertTrue(os.path.exists(cache))
        again = run("tiny-bf16", self.images[0], "--prompt-cache", cache)
        self.assertIn("prompt cache: reusing", again.stderr)
        self.assertEqual(first.stdout, plain)
        self.assertEqual(again.stdout, plain)
        other = run("tiny-bf16", self.images[1], "--prompt-cache", cache)
        self.assertNotIn("prompt cache: reusing", other.stderr)
        self.assertEqual(other.stdout, run("tiny-bf16", self.images[1]).stdout)
        for model, extra, fields in [("tiny-bf16", ["--mask-mode", "mlx"], ["mask_mode (hf vs mlx)"]),
                                     ("tiny-f32", [], ["weight_dtypes (BF16 vs F32)", "scaling_policy"])]:
            r = run(model, self.images[1], "--prompt-cache", cache, *extra, check=False)
            with self.subTest(model=model, extra=extra):
                self.assertEqual(r.returncode, 1)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                self.assertIn("another model identity", r.stderr)
                for f in fields:
                    self.assertIn(f, r.stderr)
        with open(cache, "r+b") as f:  # a truncated file is an error, not a crash
            f.truncate(os.path.getsize(cache) // 2)
        r = run("tiny-bf16", self.images[1], "--prompt-cache", cache, check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("truncated", r.stderr)


if __name__ == "__main__":
    unittest.main()
