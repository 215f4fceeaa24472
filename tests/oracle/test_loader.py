"""`vlm inspect --json --checksums` against the oracle's own reading of the same folders.

Compared per fixture: architecture, naming scheme, every config value the math uses (with HF
defaults filled in by the oracle), layer kinds, the set of canonical tensor names, and per tensor
its file name, file, dtype, shape, byte size, FNV-1a-64 of the raw bytes (exact) and the float64
sum of its values. Sum tolerance: |ours - oracle| <= max(1e-9, n * 2^-53) * sum(|x|) — float64
accumulation of n terms in any order stays within n * 2^-53 * sum(|x|) of the exact sum, so the
bound cannot fail on a correct reader, while a single wrong element moves the sum far more.
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402

BIN = os.environ.get("VLM_BIN")
FIXTURES = os.environ.get("VLM_FIXTURES")
SOURCE = os.environ.get("VLM_SOURCE_DIR",
                        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIG_DIR = os.environ.get("VLM_BIG_DIR", os.path.join(SOURCE, "build", "ckpt", "gemma3-4b"))

TEXT_KEYS = ["vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
             "num_kv_heads", "head_dim", "query_pre_attn_scalar", "rms_norm_eps",
             "max_position_embeddings", "sliding_window", "rope_theta", "rope_local_base_freq",
             "rope_scaling_factor", "layer_kinds"]
VISION_KEYS = ["hidden_size", "intermediate_size", "num_layers", "num_heads", "image_size",
               "patch_size", "layer_norm_eps"]


def inspect(model, *extra):
    r = subprocess.run([BIN, "inspect", "--model", model, "--json", *extra],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise AssertionError(f"vlm inspect {model} failed ({r.returncode}): {r.stderr.strip()}")
    return json.loads(r.stdout)


def requires_bin(cls):
    missing = [n for n, v in (("VLM_BIN", BIN), ("VLM_FIXTURES", FIXTURES)) if not v]
    return unittest.skipIf(missing, f"set {', '.join(missing)} (ctest does)")(cls)


class Base(unittest.TestCase):
    def check_config(self, got, cfg, naming):
        self.assertEqual(got["architecture"], cfg["architecture"])
        self.assertEqual(got["arch"], cfg["arch"])
        self.assertEqual(got["naming"], naming)
        for k in TEXT_KEYS:
            self.assertIn(k, got["text"], f"text.{k} missing")
            self.assertEqual(got["text"][k], cfg["text"][k], f"text.{k}")
        if cfg["vision"] is None:
            self.assertIsNone(got["vision"])
            self.assertIsNone(got["mm_tokens_per_image"])
        else:
            for k in VISION_KEYS:
                self.assertIn(k, got["vision"], f"vision.{k} missing")
                self.assertEqual(got["vision"][k], cfg["vision"][k], f"vision.{k}")
            self.assertEqual(got["mm_tokens_per_image"], cfg["mm_tokens_per_image"])

    def check_tensors(self, got, tensors, checksums, what):
        by_name = {t["name"]: t for t in got["tensors"]}
        self.assertEqual(len(by_name), len(got["tensors"]), f"{what}: a tensor is listed twice")
        self.assertEqual(sorted(by_name), sorted(tensors), f"{what}: tensor names")
        for name, t in sorted(tensors.items()):
            g = by_name[name]
            where = f"{what}: {name}"
            self.assertEqual(g["file_name"], t.file_name, where)
            self.assertEqual(os.path.basename(g["file"]), os.path.basename(t.path), where)
            self.assertEqual(g["dtype"], t.dtype, where)
            self.assertEqual(list(g["shape"]), t.shape, where)
            self.assertEqual(g["nbytes"], t.nbytes, where)
            if not checksums:
                continue
            self.assertEqual(g["fnv1a64"], st.fnv1a64(t.raw()), where)
            x = t.f32()
            want = float(np.sum(x, dtype=np.float64))
            tol = max(1e-9, t.numel * 2.0 ** -53) * float(np.sum(np.abs(x), dtype=np.float64))
            self.assertLessEqual(abs(g["sum"] - want), tol, f"{where}: sum {g['sum']!r} vs {want!r}")

    def check_counts(self, got, tensors):
        params = {"text": 0, "vision": 0, "projector": 0}
        nbytes = dict(params)
        for name, t in tensors.items():
            params[st.part_of(name)] += t.numel
            nbytes[st.part_of(name)] += t.nbytes
        params["total"] = sum(params.values())
        nbytes["total"] = sum(nbytes.values())
        for k in params:
            self.assertEqual(got["params"][k], params[k], f"params.{k}")
            self.assertEqual(got["bytes"][k], nbytes[k], f"bytes.{k}")


@requires_bin
class TestInspectFixtures(Base):
    FOLDERS = ["tiny-f32", "tiny-bf16", "tiny-f16", "tiny-old-sharded", "tiny-text-f32",
               "tiny-text-sharded"]

    def test_fixtures_agree_with_oracle(self):
        for folder in self.FOLDERS:
            with self.subTest(folder=folder):
                d = os.path.join(FIXTURES, folder)
                cfg, tensors, naming, unknown = st.load_checkpoint(d)
                got = inspect(d, "--checksums")
                self.check_config(got, cfg, naming)
                self.check_tensors(got, tensors, True, folder)
                self.assertEqual(sorted(got["unknown_tensors"]), unknown)
                self.check_counts(got, tensors)
                self.assertTrue(got["identity"]["hash"])
                self.assertTrue(got["identity"]["fields"])

    def test_fixture_shapes_match_spec(self):
        # Guards the oracle itself: the folders hold exactly the tensors docs/gemma3/checkpoint.md lists.
        for folder in self.FOLDERS:
            with self.subTest(folder=folder):
                cfg, tensors, _, unknown = st.load_checkpoint(os.path.join(FIXTURES, folder))
                want = st.expected_shapes(cfg, explicit_head=False)
                self.assertEqual({k: t.shape for k, t in tensors.items()}, want)
                self.assertEqual(unknown, [])

    def test_tiny_layer_kinds(self):
        # Brief: globals are layers 2 and 5 — via the legacy pattern (VLM) and layer_types (text).
        for folder in ("tiny-f32", "tiny-text-f32"):
            got = inspect(os.path.join(FIXTURES, folder))
            self.assertEqual(got["text"]["layer_kinds"],
                             ["sliding", "sliding", "global", "sliding", "sliding", "global"], folder)

    def test_text_only_has_no_vision_tensors(self):
        d = os.path.join(FIXTURES, "tiny-bf16")
        cfg, tensors, _, _ = st.load_checkpoint(d)
        text = {k: t for k, t in tensors.items() if st.part_of(k) == "text"}
        got = inspect(d, "--checksums", "--text-only")
        self.check_tensors(got, text, True, "tiny-bf16 --text-only")
        # The vision tensors are known, just not loaded: they are not "unknown" either.
        for name in got["unknown_tensors"]:
            self.assertNotIn("vision", name)
            self.assertNotIn("projector", name)

    def test_unknown_tensors_are_reported(self):
        # A sharded checkpoint plus a third file (named in index.json) holding tensors no part
        # uses: an unrelated one (reported), a SigLIP pooling-head tensor and a rotary buffer
        # (docs/gemma3/checkpoint.md: ignored, so not reported).
        sys.path.insert(0, os.path.join(SOURCE, "tools"))
        import make_checkpoint
        with tempfile.TemporaryDirectory(prefix="vlm-unknown-") as d:
            make_checkpoint.make("tiny", d, dtype="bf16", shards=2, seed=3)
            extra = {"model.vision_tower.vision_model.head.probe.weight": np.arange(6, dtype="<f4"),
                     "model.language_model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(12, dtype="<f4"),
                     "model.language_model.extra_probe.weight": np.ones(4, dtype="<f4")}
            header, blob = {}, b""
            for name, x in extra.items():
                header[name] = {"dtype": "F32", "shape": [x.size], "data_offsets": [len(blob), len(blob) + x.nbytes]}
                blob += x.tobytes()
            h = json.dumps(header).encode()
            h += b" " * (-len(h) % 8)
            with open(os.path.join(d, "model-extra.safetensors"), "wb") as f:
                f.write(len(h).to_bytes(8, "little") + h + blob)
            index_path = os.path.join(d, "model.safetensors.index.json")
            with open(index_path) as f:
                index = json.load(f)
            index["weight_map"].update({n: "model-extra.safetensors" for n in extra})
            with open(index_path, "w") as f:
                json.dump(index, f)
            cfg, tensors, naming, unknown = st.load_checkpoint(d)
            self.assertEqual(unknown, ["model.language_model.extra_probe.weight"])
            got = inspect(d, "--checksums")
            self.assertEqual(sorted(got["unknown_tensors"]), unknown)
            self.check_config(got, cfg, naming)
            self.check_tensors(got, tensors, False, "tiny + unknown")
            self.check_counts(got, tensors)

    def test_explicit_lm_head(self):
        # An untied head is loaded as lm_head.weight from either naming scheme
        # (docs/gemma3/checkpoint.md#naming).
        sys.path.insert(0, os.path.join(SOURCE, "tools"))
        import make_checkpoint
        for naming in ("old", "new"):
            with self.subTest(naming=naming), tempfile.TemporaryDirectory(prefix="vlm-head-") as d:
                make_checkpoint.make("tiny", d, dtype="bf16", naming=naming, lm_head=True, seed=4)
                cfg, tensors, got_naming, unknown = st.load_checkpoint(d)
                self.assertIn("lm_head.weight", tensors)
                got = inspect(d)
                self.check_config(got, cfg, got_naming)
                self.check_tensors(got, tensors, False, f"tiny {naming} + lm_head")
                self.assertEqual(got["unknown_tensors"], unknown)
                self.check_counts(got, tensors)

    def test_identity(self):
        def ident(folder):
            return inspect(os.path.join(FIXTURES, folder))["identity"]["hash"]
        self.assertEqual(ident("tiny-bf16"), ident("tiny-bf16"), "identity must be stable")
        # Storage dtype and architecture change the numbers; naming and sharding do not.
        self.assertNotEqual(ident("tiny-f32"), ident("tiny-bf16"))
        self.assertNotEqual(ident("tiny-f32"), ident("tiny-text-f32"))
        self.assertEqual(ident("tiny-bf16"), ident("tiny-old-sharded"))
        self.assertEqual(ident("tiny-text-f32"), ident("tiny-text-sharded"))


@requires_bin
class TestInspectGemma3_4B(Base):
    """A gemma3-4b-shaped checkpoint (random bf16, ~8.6 GB): names, shapes, dtypes, config."""

    def setUp(self):
        have = os.path.isfile(os.path.join(BIG_DIR, ".stamp"))
        if not have and os.environ.get("VLM_BIG") != "1":
            self.skipTest(f"no gemma3-4b checkpoint at {BIG_DIR}; "
                          "set VLM_BIG=1 to generate it (~8.6 GB, a few minutes)")
        if not have:
            sys.path.insert(0, os.path.join(SOURCE, "tools"))
            import make_checkpoint
            # As Google publishes it: older naming, two shards.
            make_checkpoint.make("gemma3-4b", BIG_DIR, dtype="bf16", shards=2, naming="old", seed=0)
            with open(os.path.join(BIG_DIR, ".stamp"), "w") as f:
                f.write("gemma3-4b bf16 old 2 shards seed 0\n")

    def test_4b(self):
        cfg, tensors, naming, unknown = st.load_checkpoint(BIG_DIR)
        # The minimal config leaves these to the HF class defaults
        # (docs/gemma3/config.md#text-config, 4B column).
        t = cfg["text"]
        self.assertEqual((t["vocab_size"], t["num_heads"], t["num_kv_heads"], t["head_dim"],
                          t["query_pre_attn_scalar"], t["max_position_embeddings"]),
                         (262208, 8, 4, 256, 256.0, 131072))
        self.assertEqual([i for i, k in enumerate(t["layer_kinds"]) if k == "global"],
                         [5, 11, 17, 23, 29])
        self.assertEqual((t["rope_theta"], t["rope_local_base_freq"], t["rope_scaling_factor"]),
                         (1e6, 1e4, 8.0))
        self.assertEqual(st.expected_shapes(cfg, explicit_head=False),
                         {k: t.shape for k, t in tensors.items()})
        self.assertEqual(tensors["text.layers.0.self_attn.q_proj.weight"].shape, [2048, 2560])
        self.assertEqual(tensors["vision.embeddings.position_embedding.weight"].shape, [4096, 1152])
        self.assertEqual(tensors["projector.mm_input_projection_weight"].shape, [1152, 2560])
        got = inspect(BIG_DIR)
        self.check_config(got, cfg, naming)
        self.check_tensors(got, tensors, False, "gemma3-4b")
        self.assertEqual(sorted(got["unknown_tensors"]), unknown)
        self.check_counts(got, tensors)


class TestFnv(unittest.TestCase):
    def test_published_vectors(self):
        # FNV-1a 64 reference values (Fowler/Noll/Vo test suite).
        self.assertEqual(st.fnv1a64(b""), "cbf29ce484222325")
        self.assertEqual(st.fnv1a64(b"a"), "af63dc4c8601ec8c")
        self.assertEqual(st.fnv1a64(b"foobar"), "85944171f73967e8")


if __name__ == "__main__":
    unittest.main()
