"""tools/make_checkpoint.py: deterministic bytes, exact rounding, HF layout, real shapes.

Read back with the oracle's reader (st.py), never with the writer's own code.
"""
import filecmp
import json
import os
import shutil
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
SOURCE = os.environ.get("VLM_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(SOURCE, "tools"))
import make_checkpoint  # noqa: E402
import st  # noqa: E402
from cfg import read_config  # noqa: E402


def files_of(d):
    return sorted(f for f in os.listdir(d))


class Tmp(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="vlm-ckpt-test-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def make(self, name, preset="tiny", **kw):
        d = os.path.join(self.tmp, name)
        make_checkpoint.make(preset, d, **kw)
        return d


class TestDeterminism(Tmp):
    def test_same_seed_same_bytes_other_seed_differs(self):
        a = self.make("a", dtype="bf16", seed=7, shards=2)
        b = self.make("b", dtype="bf16", seed=7, shards=2)
        c = self.make("c", dtype="bf16", seed=8, shards=2)
        self.assertEqual(files_of(a), files_of(b))
        for f in files_of(a):
            self.assertTrue(filecmp.cmp(os.path.join(a, f), os.path.join(b, f), shallow=False), f)
        for f in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
            self.assertFalse(filecmp.cmp(os.path.join(a, f), os.path.join(c, f), shallow=False), f)
        self.assertTrue(filecmp.cmp(os.path.join(a, "config.json"), os.path.join(c, "config.json"),
                                    shallow=False))


def check_nearest(test, x, bits, to_f32, what):
    """bits[i] must encode the representable value nearest x[i], ties to an even pattern.

    Checked against both neighbouring bit patterns (same sign, magnitude +-1 ulp), in float64
    where every difference here is exact.
    """
    x = x.astype(np.float64).ravel()
    bits = bits.ravel().astype(np.uint32)
    mag = bits & 0x7FFF
    v = to_f32(bits).astype(np.float64)
    up = to_f32(bits + 1).astype(np.float64)
    down = np.where(mag > 0, to_f32(np.where(mag > 0, bits - 1, bits)).astype(np.float64), np.inf)
    err = np.abs(x - v)
    test.assertTrue(np.all(np.isfinite(v)), what)
    test.assertTrue(np.all(err <= np.abs(x - up)), f"{what}: a value rounds to the wrong neighbour")
    test.assertTrue(np.all(err <= np.abs(x - down)), f"{what}: a value rounds to the wrong neighbour")
    tie = (err == np.abs(x - up)) | (err == np.abs(x - down))
    test.assertTrue(np.all(bits[tie & (err > 0)] % 2 == 0), f"{what}: a tie not rounded to even")


def bf16_value(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f16_value(bits):
    return bits.astype(np.uint16).view(np.float16).astype(np.float32)


class TestEncoding(Tmp):
    def test_bf16_and_f16_round_to_nearest_even_from_the_f32_values(self):
        _, f32 = st.load_f32(self.make("f32", dtype="f32"))
        _, bf = st.load_checkpoint(self.make("bf16", dtype="bf16"))[:2]
        _, hf = st.load_checkpoint(self.make("f16", dtype="f16"))[:2]
        for name, x in f32.items():
            if x.size > 1 << 20:
                x = x.ravel()[: 1 << 20]  # the embedding: its first million values suffice
            n = x.size
            check_nearest(self, x, bf[name].raw().view("<u2")[:n], bf16_value, f"bf16 {name}")
            check_nearest(self, x, hf[name].raw().view("<u2")[:n], f16_value, f"f16 {name}")

    def test_bf16_helper_on_edge_values(self):
        x = np.array([1.0, 1.00390625, 1.01171875, -1.00390625, 3.0e38, 1e-40, 0.0, -0.0],
                     np.float32)
        # 1+2^-8 is a tie between 1.0 (even) and 1+2^-7 (odd) -> 1.0; 1+3*2^-8 ties up to even.
        got = make_checkpoint.f32_to_bf16_bits(x)
        self.assertEqual([hex(b) for b in got],
                         ["0x3f80", "0x3f80", "0x3f82", "0xbf80", "0x7f62", "0x1", "0x0", "0x8000"])
        nan = make_checkpoint.f32_to_bf16_bits(np.array([np.nan], np.float32))[0]
        self.assertTrue(np.isnan(bf16_value(np.array([nan]))[0]))

    def test_same_values_whatever_naming_and_shards(self):
        _, a = st.load_f32(self.make("new", dtype="bf16"))
        _, b = st.load_f32(self.make("old", dtype="bf16", naming="old", shards=3))
        self.assertEqual(sorted(a), sorted(b))
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], k)


class TestLayout(Tmp):
    def check_folder(self, d, naming, shards):
        cfg, tensors, got_naming, unknown = st.load_checkpoint(d)
        self.assertEqual(got_naming, naming)
        self.assertEqual(unknown, [])
        self.assertEqual({k: t.shape for k, t in tensors.items()},
                         st.expected_shapes(cfg, explicit_head=False))
        prefixes = {"old": ("language_model.model.", "vision_tower.vision_model.", "multi_modal_projector."),
                    "new": ("model.language_model.", "model.vision_tower.vision_model.",
                            "model.multi_modal_projector."),
                    "causal_lm": ("model.",)}[naming]
        for t in tensors.values():
            self.assertTrue(t.file_name.startswith(prefixes), t.file_name)
            if naming == "causal_lm":
                self.assertFalse(t.file_name.startswith(("model.language_model.", "model.vision")))
        files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
        for f in files:
            _, data = st.read_header(os.path.join(d, f))
            self.assertEqual(data % 8, 0, f"{f}: data section not 8-byte aligned")
        if shards == 1:
            self.assertEqual(files, ["model.safetensors"])
            self.assertFalse(os.path.exists(os.path.join(d, "model.safetensors.index.json")))
        else:
            self.assertEqual(files, [f"model-{i:05d}-of-{shards:05d}.safetensors"
                                     for i in range(1, shards + 1)])
            with open(os.path.join(d, "model.safetensors.index.json")) as f:
                index = json.load(f)
            self.assertEqual(index["metadata"]["total_size"], sum(t.nbytes for t in tensors.values()))
            self.assertEqual(sorted(index["weight_map"]), sorted(t.file_name for t in tensors.values()))
            self.assertEqual(sorted(set(index["weight_map"].values())), files)  # no empty shard
        for f in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
            self.assertTrue(os.path.isfile(os.path.join(d, f)), f)
        vlm = cfg["vision"] is not None
        self.assertEqual(os.path.isfile(os.path.join(d, "preprocessor_config.json")), vlm)
        return cfg

    def test_tiny_vlm_both_namings(self):
        for naming, shards in (("new", 1), ("old", 3), ("new", 4), ("old", 1)):
            with self.subTest(naming=naming, shards=shards):
                d = self.make(f"{naming}{shards}", dtype="f16", naming=naming, shards=shards)
                cfg = self.check_folder(d, naming, shards)
                t, v = cfg["text"], cfg["vision"]
                # The brief's `tiny` preset.
                self.assertEqual((t["hidden_size"], t["num_layers"], t["num_heads"], t["num_kv_heads"],
                                  t["head_dim"], t["query_pre_attn_scalar"], t["intermediate_size"],
                                  t["vocab_size"], t["sliding_window"], t["max_position_embeddings"]),
                                 (64, 6, 4, 2, 24, 32, 128, 262208, 8, 1024))
                self.assertEqual((t["rope_theta"], t["rope_local_base_freq"], t["rope_scaling_factor"]),
                                 (1e6, 1e4, 8.0))
                self.assertEqual(t["layer_kinds"], ["sliding", "sliding", "global"] * 2)
                self.assertEqual((v["image_size"], v["patch_size"], v["hidden_size"], v["num_heads"],
                                  v["intermediate_size"], v["num_layers"], v["layer_norm_eps"]),
                                 (64, 8, 32, 2, 64, 2, 1e-6))
                self.assertEqual((cfg["mm_tokens_per_image"], cfg["boi_token_id"], cfg["eoi_token_id"],
                                  cfg["image_token_id"]), (16, 255999, 256000, 262144))
                with open(os.path.join(d, "preprocessor_config.json")) as f:
                    self.assertEqual(json.load(f)["size"], {"height": 64, "width": 64})

    def test_tiny_text(self):
        for shards in (1, 2):
            d = self.make(f"text{shards}", preset="tiny-text", dtype="f32", shards=shards)
            cfg = self.check_folder(d, "causal_lm", shards)
            t = cfg["text"]
            self.assertEqual((t["vocab_size"], t["rope_scaling_factor"]), (262144, 1.0))
            self.assertEqual(t["layer_kinds"], ["sliding", "sliding", "global"] * 2)
            with open(os.path.join(d, "config.json")) as f:
                raw = json.load(f)
            self.assertIn("layer_types", raw)
            self.assertNotIn("sliding_window_pattern", raw)

    def test_explicit_lm_head(self):
        for naming, name in (("old", "language_model.lm_head.weight"), ("new", "lm_head.weight")):
            d = self.make(f"head-{naming}", dtype="bf16", naming=naming, lm_head=True)
            cfg, tensors, _, unknown = st.load_checkpoint(d)
            self.assertEqual(unknown, [])
            self.assertEqual(tensors["lm_head.weight"].file_name, name)
            self.assertEqual(tensors["lm_head.weight"].shape, [262208, 64])
            self.assertFalse(cfg["text"]["tie_word_embeddings"])

    def test_refuses_bad_options(self):
        for kw in (dict(preset="tiny-text", naming="old"), dict(preset="nope"), dict(dtype="f64")):
            with self.subTest(**kw), self.assertRaises(SystemExit):
                make_checkpoint.make(kw.pop("preset", "tiny"), os.path.join(self.tmp, "x"), **kw)


class TestRealShapes(unittest.TestCase):
    """Shapes of the benchmark presets, without writing gigabytes: the writer's tensor table
    against the oracle's reading of the config it writes (docs/gemma3/config.md#text-config,
    docs/gemma3/checkpoint.md)."""

    def shapes_of(self, preset):
        d = tempfile.mkdtemp(prefix="vlm-ckpt-cfg-")
        try:
            cfg_json = make_checkpoint.PRESETS[preset]("bfloat16")
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(cfg_json, f)
            cfg = read_config(d)
        finally:
            shutil.rmtree(d)
        text = cfg_json.get("text_config", cfg_json)
        dims = {"vocab_size": 262208, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256}
        dims.update(text)
        table = make_checkpoint.text_tensors(dims, False)
        if "vision_config" in cfg_json:
            table += make_checkpoint.vision_tensors(cfg_json["vision_config"], dims["hidden_size"])
        return cfg_json, cfg, {n: s for n, s, _ in table}

    def test_gemma3_4b(self):
        raw, cfg, shapes = self.shapes_of("gemma3-4b")
        self.assertEqual(sorted(raw["text_config"]), ["hidden_size", "intermediate_size", "model_type",
                                                      "num_hidden_layers", "rope_scaling", "sliding_window"])
        self.assertEqual(shapes, st.expected_shapes(cfg, explicit_head=False))
        self.assertEqual(shapes["text.embed_tokens.weight"], [262208, 2560])
        self.assertEqual(shapes["text.layers.33.self_attn.k_proj.weight"], [1024, 2560])
        self.assertEqual(shapes["vision.encoder.layers.26.mlp.fc1.weight"], [4304, 1152])
        self.assertEqual(shapes["vision.embeddings.patch_embedding.weight"], [1152, 3, 14, 14])
        kinds = cfg["text"]["layer_kinds"]
        self.assertEqual([i for i, k in enumerate(kinds) if k == "global"], [5, 11, 17, 23, 29])
        n = sum(int(np.prod(s)) for s in shapes.values())
        self.assertTrue(4.2e9 < n < 4.4e9, n)  # "4B": 3.88B text + 0.42B vision

    def test_gemma3_1b(self):
        _, cfg, shapes = self.shapes_of("gemma3-1b")
        self.assertEqual(shapes, st.expected_shapes(cfg, explicit_head=False))
        self.assertEqual(shapes["text.embed_tokens.weight"], [262144, 1152])
        self.assertEqual(shapes["text.layers.0.self_attn.q_proj.weight"], [1024, 1152])
        self.assertEqual(shapes["text.layers.0.self_attn.k_proj.weight"], [256, 1152])
        kinds = cfg["text"]["layer_kinds"]
        self.assertEqual([i for i, k in enumerate(kinds) if k == "global"], [5, 11, 17, 23])


if __name__ == "__main__":
    unittest.main()
