"""GGUF files written by tools/convert_hf_to_gguf.py (tools/gguf_writer.py):

* round trip: the tensors read back are the checkpoint's bytes (f32, bf16), norms exactly
  f32(w) + 1, names and shapes as llama.cpp's; quantized tensors dequantize (NumPy reference of
  the block formats) to within their block rounding;
* the mmproj file's layout;
* llama.cpp (npm node-llama-cpp, prebuilt CPU binary, tests/e2e/js/llama_cpp.mjs) loads every
  file type; its tokenizer on our tokenizer.ggml.* keys gives tokenizer.json's ids on the
  corpus of test_tokenizer_vs_js.py; on an f32 file its greedy tokens equal `vlm run` on the
  safetensors folder (the checkpoint is built so llama.cpp's fixed Gemma 3 rules hold for it:
  global layer every 6th, query_pre_attn_scalar = head_dim);
* vlm's own tokenizer from the GGUF keys (text::tokenizer_from_gguf, run through vlm_tests) on
  the same corpus;
* vlm runs the GGUF files: `vlm dump` logits on f32/bf16 files equal the safetensors folder's
  (1e-5), Q8_0 within the bound of docs/gguf.md §7, images through --mmproj equal the folder's
  image rows; a folder holding the files works; a missing tensor, a wrong shape or an unknown
  quantization type is a one-line error; a prompt cache from another quantization is refused.
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

BIN = os.environ.get("VLM_BIN", "build/vlm")
SRC = os.environ.get("VLM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
FIX = os.environ.get("VLM_FIXTURES", os.path.join(SRC, "build", "fixtures"))
sys.path.insert(0, os.path.join(SRC, "tools"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import convert_hf_to_gguf  # noqa: E402
import gguf_writer  # noqa: E402
import make_checkpoint  # noqa: E402
from test_tokenizer_vs_js import make_corpus, node  # noqa: E402

LLAMA_JS = os.path.join(SRC, "tests/e2e/js/llama_cpp.mjs")
NODE_LLAMA = os.path.join(SRC, "tools/npm/node_modules/node-llama-cpp")
PY = "/usr/bin/python3"


def lc_config(dtype_name, hidden=256):
    """Gemma3ForCausalLM whose HF semantics llama.cpp's gemma3 graph reproduces: 6 layers with
    layer 5 global (llama.cpp's fixed period 6), query_pre_attn_scalar = head_dim (llama.cpp's
    1/sqrt(key_length)), rows of 256 (K-quant blocks) and a vocabulary cut to 8192 ids. hidden=288
    is Gemma 3 1B's case (1152): rows of the width are not whole 256-blocks, the others are."""
    return {
        "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "attn_logit_softcapping": None, "bos_token_id": 2, "eos_token_id": [1, 106],
        "final_logit_softcapping": None, "head_dim": 64, "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": hidden, "intermediate_size": 512, "layer_types":
            ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(6)],
        "max_position_embeddings": 1024, "model_type": "gemma3_text", "num_attention_heads": 4,
        "num_hidden_layers": 6, "num_key_value_heads": 2, "pad_token_id": 0, "query_pre_attn_scalar": 64,
        "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0, "rope_scaling": None, "rope_theta": 1000000.0,
        "sliding_window": 16, "sliding_window_pattern": 6, "torch_dtype": dtype_name, "vocab_size": 8192,
    }


def make_lc(out, dtype, hidden=256):
    os.makedirs(out, exist_ok=True)
    cfg = lc_config(make_checkpoint.DTYPES[dtype][2], hidden)
    entries = [(c, make_checkpoint.file_name(c, "causal_lm"), shape, init)
               for c, shape, init in make_checkpoint.text_tensors(cfg, False)]
    make_checkpoint.write_safetensors(os.path.join(out, "model.safetensors"), entries, dtype, 0)
    make_checkpoint.write_json(os.path.join(out, "config.json"), cfg)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(make_checkpoint.TOKENIZER_DIR, f), os.path.join(out, f))


def convert(src, out, gtype, *extra):
    convert_hf_to_gguf.main([src, "--out", out, "--type", gtype, *extra])


def llama(model, payload):
    with tempfile.TemporaryDirectory() as d:
        inp, out = os.path.join(d, "in.json"), os.path.join(d, "out.json")
        with open(inp, "w") as f:
            json.dump(payload, f)
        r = subprocess.run(["node", LLAMA_JS, model, inp, out], capture_output=True, text=True, timeout=1200)
        if r.returncode != 0:
            raise AssertionError(f"llama.cpp on {model} failed: {r.stderr[-2000:]}")
        with open(out) as f:
            return json.load(f)


def vlm_greedy(model_dir, ids, n):
    r = subprocess.run([BIN, "run", "--model", model_dir, "--tokens", json.dumps(ids), "--ids",
                        "--max-tokens", str(n), "--temperature", "0"], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise AssertionError(r.stderr)
    return [int(t) for t in r.stdout.split("\n")[0].split()]


def vlm_dump(model, out, *args):
    r = subprocess.run([BIN, "dump", "--model", *model, "--out", out, "--steps", "0", *args], capture_output=True,
                       text=True, timeout=600)
    if r.returncode != 0:
        raise AssertionError(r.stderr)
    return out


def refused(tc, args, *fragments):
    """`vlm args` exits 1 with one short stderr line holding every fragment."""
    r = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120)
    err = r.stderr.strip()
    tc.assertEqual(r.returncode, 1, err)
    tc.assertEqual(len(err.splitlines()), 1, err[:2000])
    for f in fragments:
        tc.assertIn(f, err)
    return err


def patch_tensor_info(src, dst, name, new_name=None, ne1=None, type_id=None):
    """A copy of GGUF file src with tensor `name`'s info edited in place: renamed (same length), its ne[1]
    changed, or its ggml type id changed (the data stay as they are)."""
    with open(src, "rb") as f:
        buf = bytearray(f.read())
    key = len(name).to_bytes(8, "little") + name.encode()
    at = buf.index(key) + 8
    if new_name:
        assert len(new_name) == len(name)
        buf[at:at + len(name)] = new_name.encode()
    at += len(name)
    n_dims = int.from_bytes(buf[at:at + 4], "little")
    if ne1 is not None:
        buf[at + 12:at + 20] = ne1.to_bytes(8, "little")
    if type_id is not None:
        buf[at + 4 + 8 * n_dims:at + 8 + 8 * n_dims] = type_id.to_bytes(4, "little")
    with open(dst, "wb") as f:
        f.write(buf)
    return dst


def st_tensors(path):
    """{name: (dtype, shape, bytes)} of one safetensors file."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        h = json.loads(f.read(n))
        base = 8 + n
        out = {}
        for k, e in h.items():
            if k == "__metadata__":
                continue
            f.seek(base + e["data_offsets"][0])
            out[k] = (e["dtype"], e["shape"], f.read(e["data_offsets"][1] - e["data_offsets"][0]))
    return out


class Gguf(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="vlm-gguf-")
        cls.lc = {d: os.path.join(cls.tmp, f"lc-{d}") for d in ("f32", "bf16")}
        for d, p in cls.lc.items():
            make_lc(p, d)
        cls.files = {}
        for t in ("f32", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl",
                  "iq4_xs"):
            cls.files[t] = os.path.join(cls.tmp, f"lc-{t}.gguf")
            convert(cls.lc["f32"], cls.files[t], t)
        cls.files["bf16"] = os.path.join(cls.tmp, "lc-bf16.gguf")
        convert(cls.lc["bf16"], cls.files["bf16"], "bf16")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_round_trip_f32_and_bf16(self):
        for dt, st_dtype in (("f32", "F32"), ("bf16", "BF16")):
            meta, ts = gguf_writer.read(self.files[dt])
            src = st_tensors(os.path.join(self.lc[dt], "model.safetensors"))
            self.assertEqual(len(ts), 2 + 6 * 13)
            self.assertNotIn("output.weight", ts)  # tied head
            for hf, (dtype, shape, raw) in src.items():
                c = convert_hf_to_gguf.strip_prefix(hf)
                name = convert_hf_to_gguf.text_name(c)
                gtype, gshape, gdata = ts[name]
                self.assertEqual(gshape, shape, name)
                self.assertEqual(dtype, st_dtype)
                if hf.endswith("norm.weight"):
                    w = gguf_writer.dequantize(raw, dt, math.prod(shape))
                    self.assertEqual(gtype, "f32", name)
                    np.testing.assert_array_equal(np.frombuffer(gdata, "<f4"), (w + np.float32(1)).astype(np.float32))
                else:
                    self.assertEqual(gtype, dt, name)
                    self.assertEqual(gdata, raw, f"{name}: bytes differ from {hf}")
            self.assertEqual(meta["general.architecture"], "gemma3")
            self.assertEqual(meta["gemma3.block_count"], 6)
            self.assertEqual(meta["gemma3.attention.key_length"], 64)
            self.assertEqual(meta["gemma3.attention.sliding_window"], 16)
            self.assertEqual(meta["gemma3.embedding_length"], 256)
            self.assertEqual(len(meta["tokenizer.ggml.tokens"]), 8192)
            self.assertEqual(meta["tokenizer.ggml.add_space_prefix"], False)
            self.assertEqual(meta["tokenizer.ggml.bos_token_id"], 2)
            self.assertEqual(meta["tokenizer.ggml.eos_token_id"], 106)
            with open(os.path.join(self.lc[dt], "tokenizer_config.json")) as f:
                self.assertEqual(meta["tokenizer.chat_template"], json.load(f)["chat_template"])

    def test_quantized_tensors_within_block_rounding(self):
        src = {convert_hf_to_gguf.text_name(convert_hf_to_gguf.strip_prefix(k)): v
               for k, v in st_tensors(os.path.join(self.lc["f32"], "model.safetensors")).items()}
        # Worst relative RMS error seen per format (these are loose sanity bounds, not the format's).
        limit = {"q8_0": 0.01, "q4_0": 0.2, "q4_1": 0.1, "q5_0": 0.1, "q5_1": 0.1, "q2_k": 0.4, "q3_k": 0.2,
                 "q4_k": 0.2, "q5_k": 0.1, "q6_k": 0.05, "iq4_nl": 0.2, "iq4_xs": 0.2}
        for t, lim in limit.items():
            _, ts = gguf_writer.read(self.files[t])
            n_quant = 0
            for name, (gtype, shape, data) in ts.items():
                if name.endswith("norm.weight"):
                    continue
                x = np.frombuffer(src[name][2], "<f4")
                self.assertEqual(gtype, t, name)
                y = gguf_writer.dequantize(data, gtype, x.size)
                rel = float(np.sqrt(np.mean((y - x) ** 2) / np.mean(x ** 2)))
                self.assertLess(rel, lim, f"{t} {name}")
                n_quant += 1
            self.assertEqual(n_quant, 1 + 6 * 7)

    def test_mmproj_layout(self):
        tmp = os.path.join(self.tmp, "vlm")
        convert(os.path.join(FIX, "tiny-bf16"), tmp + ".gguf", "bf16", "--mmproj-out", tmp + "-mmproj.gguf",
                "--mmproj-type", "bf16")
        meta, ts = gguf_writer.read(tmp + "-mmproj.gguf")
        with open(os.path.join(FIX, "tiny-bf16", "config.json")) as f:
            cfg = json.load(f)
        v, L = cfg["vision_config"], cfg["vision_config"]["num_hidden_layers"]
        self.assertEqual(meta["general.architecture"], "clip")
        self.assertEqual(meta["clip.projector_type"], "gemma3")
        self.assertEqual(meta["clip.vision.projection_dim"], cfg["text_config"]["hidden_size"])
        self.assertEqual(meta["clip.vision.projector.scale_factor"], 2)  # 8x8 patches -> 4x4 tokens
        self.assertEqual(len(ts), 3 + L * 16 + 2 + 2)
        D, p = v["hidden_size"], v["patch_size"]
        self.assertEqual(ts["v.patch_embd.weight"][:2], ("f32", [D, 3, p, p]))
        self.assertEqual(ts["v.position_embd.weight"][0], "f32")
        self.assertEqual(ts["mm.input_projection.weight"][:2], ("f16", [D, cfg["text_config"]["hidden_size"]]))
        self.assertEqual(ts["v.blk.0.attn_q.weight"][0], "bf16")
        src = st_tensors(os.path.join(FIX, "tiny-bf16", "model.safetensors"))
        raw = src["model.multi_modal_projector.mm_soft_emb_norm.weight"][2]
        w = gguf_writer.dequantize(raw, "bf16", D)
        np.testing.assert_array_equal(np.frombuffer(ts["mm.soft_emb_norm.weight"][2], "<f4"), w + np.float32(1))
        # SigLIP LayerNorms are plain: no shift
        raw = src["model.vision_tower.vision_model.post_layernorm.weight"][2]
        np.testing.assert_array_equal(np.frombuffer(ts["v.post_ln.weight"][2], "<f4"), gguf_writer.dequantize(raw, "bf16", D))
        self.assertEqual(ts["v.blk.1.ffn_down.weight"][1], [D, v["intermediate_size"]])

    @unittest.skipUnless(os.path.isdir(NODE_LLAMA), "node-llama-cpp not installed (npm install in tools/npm)")
    def test_llama_cpp_logits_and_greedy_vs_vlm(self):
        # ids below the 8192 kept; longer than the sliding window of 16, so layers 0-4 mask
        prompt = [2] + [1000 + 37 * i % 7000 for i in range(29)]
        n = 16
        want = {}
        for dt in ("f32", "bf16"):
            out = os.path.join(self.tmp, f"dump-{dt}")
            subprocess.run([BIN, "dump", "--model", self.lc[dt], "--tokens", json.dumps(prompt), "--out", out,
                            "--steps", "0"], check=True, capture_output=True)
            want[dt] = np.load(os.path.join(out, "logits.npy"))
        greedy = vlm_greedy(self.lc["f32"], prompt, n)
        report = {}
        for t, path in self.files.items():
            r = llama(path, {"logits": [prompt], "generate": [{"ids": prompt, "n": n}]})
            got = np.array(r["logits"][0], dtype=np.float64)
            ref = want["bf16" if t == "bf16" else "f32"]
            self.assertEqual(got.shape, ref.shape, t)
            self.assertTrue(np.isfinite(got).all(), t)
            diff = float(np.abs(got - ref).max())
            same_top = int((got.argmax(-1) == ref.argmax(-1)).sum())
            report[t] = (round(diff, 4), f"top-1 {same_top}/{len(prompt)}",
                         f"greedy {sum(a == b for a, b in zip(r['generate'][0], greedy))}/{n}")
            if t not in ("f32", "bf16"):
                # vlm on the same block-quantized file (the NumPy writer's bytes) computes what llama.cpp does, up to
                # the activation rounding (bound as in test_vlm_quantize_files_run_in_llama_cpp_like_in_vlm)
                out = vlm_dump([path], os.path.join(self.tmp, f"same-{t}"), "--tokens", json.dumps(prompt))
                mine = np.load(os.path.join(out, "logits.npy"))
                report[t] += (f"vlm on the file {float(np.abs(mine - got).max()):.4f}",)
                self.assertLess(float(np.abs(mine - got).max()), 0.5, t)
                self.assertEqual(int((mine.argmax(-1) == got.argmax(-1)).sum()), len(prompt), t)
            if t == "f32":
                # llama.cpp's CPU GELU goes through an f16 table: |Δlogit| ~3e-3 at logits of ~20 (measured
                # 2.9e-3); a wrong norm shift, tensor mapping or hyperparameter moves them by > 1.
                self.assertLess(diff, 1e-2, "llama.cpp on the f32 GGUF vs vlm dump on the safetensors folder")
                self.assertEqual(same_top, len(prompt))
                self.assertEqual(r["generate"][0], greedy)
        print(f"\nllama.cpp on our GGUF vs vlm on the safetensors folder (max |dlogit|, agreement): {report}",
              file=sys.stderr)

    @unittest.skipUnless(os.path.isdir(NODE_LLAMA), "node-llama-cpp not installed (npm install in tools/npm)")
    def test_llama_cpp_tokenizer_equals_tokenizer_json(self):
        # The full 262144-piece vocabulary: the tiny text fixture converted as is.
        path = os.path.join(self.tmp, "tiny-text-bf16.gguf")
        convert(os.path.join(FIX, "tiny-text-bf16"), path, "bf16")
        corpus = [s for s in make_corpus() if s]
        want = [r["ids"] for r in node("encode-literal", corpus)]
        got = llama(path, {"tokenize": corpus})["tokenize"]
        bad = [(s, w, g) for s, w, g in zip(corpus, want, got) if w != g]
        self.assertEqual(len(got), len(corpus))
        self.assertFalse(bad, f"{len(bad)} of {len(corpus)} differ; first: {bad[:1]}")

    def test_vlm_tokenizer_from_gguf_on_corpus(self):
        tests = os.path.join(os.path.dirname(os.path.abspath(BIN)), "tests", "vlm_tests")
        corpus = os.path.join(self.tmp, "corpus.jsonl")
        with open(corpus, "w") as f:
            for s in make_corpus():
                f.write(json.dumps(s) + "\n")
        r = subprocess.run([tests, "--gtest_filter=GgufVocab.IdsEqualTokenizerJsonOnFileCorpus"], capture_output=True,
                           text=True, env=dict(os.environ, VLM_GGUF_CORPUS=corpus), timeout=1200)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-2000:])
        self.assertIn("[  PASSED  ] 1 test", r.stdout)
        self.assertNotIn("SKIPPED", r.stdout)

    # ---- vlm on GGUF files ----
    def test_vlm_gguf_logits_equal_the_folder(self):
        prompt = json.dumps([2] + [1000 + 37 * i % 7000 for i in range(29)])
        got = {}
        for name, model in (("st-f32", self.lc["f32"]), ("st-bf16", self.lc["bf16"]), ("f32", self.files["f32"]),
                            ("bf16", self.files["bf16"]), ("q8_0", self.files["q8_0"])):
            out = vlm_dump([model], os.path.join(self.tmp, f"vd-{name}"), "--tokens", prompt)
            got[name] = np.load(os.path.join(out, "logits.npy"))
        # The GGUF norms are 1 + w; vlm gets w back exactly (docs/gguf.md §7.3), so f32 and bf16 agree to
        # rounding noise only (measured 0.0).
        self.assertLessEqual(float(np.abs(got["f32"] - got["st-f32"]).max()), 1e-5)
        self.assertLessEqual(float(np.abs(got["bf16"] - got["st-bf16"]).max()), 1e-5)
        ids = json.loads(prompt)
        self.assertEqual(vlm_greedy(self.files["f32"], ids, 8), vlm_greedy(self.lc["f32"], ids, 8))
        # Q8_0 (docs/gguf.md §7): each rounding (weights and int8 activations, per 32) has rms error
        # amax/(127*sqrt(12)) ~ 0.5% of a Gaussian block; two per matmul, 4 matmul stages per layer and the head
        # (25 here) add to ~3.4% rms relative; the bound is 5% of the largest logit, and top-1 equal nearly
        # everywhere (measured: 0.215 at logits of ~19, 1.1%; top-1 30/30).
        ref, q = got["st-f32"], got["q8_0"]
        self.assertLessEqual(float(np.abs(q - ref).max()), 0.05 * float(np.abs(ref).max()))
        self.assertGreaterEqual(int((q.argmax(-1) == ref.argmax(-1)).sum()), len(ids) - 1)
        print(f"\nvlm Q8_0 GGUF vs the f32 folder: max |dlogit| {float(np.abs(q - ref).max()):.4f}", file=sys.stderr)

    def test_drafts_leave_quantized_answers_as_they_are(self):
        """`vlm run --draft 4` where a draft's rows take other kernels than one row does (bf16's dot
        tiles; the lane tiles of Q4_0 from 2 rows, Q4_K from 4, Q8_0 and Q6_K from 5): the same ids,
        greedy and seeded, as without drafts; ids are checked in every run and taken in some."""
        ids = json.dumps([2] + [1000 + 37 * (i % 6) for i in range(24)])
        taken, counts = 0, []
        for t in ("bf16", "q4_0", "q4_k", "q8_0", "q6_k"):
            for sampling in ([], ["--temperature", "1", "--seed", "5"]):
                run = [BIN, "run", "--model", self.files[t], "--tokens", ids, "--max-tokens", "32", "--ids", *sampling]
                plain = subprocess.run(run, capture_output=True, text=True, timeout=600)
                drafted = subprocess.run(run + ["--draft", "4"], capture_output=True, text=True, timeout=600)
                self.assertEqual(plain.returncode, 0, plain.stderr)
                self.assertEqual(drafted.returncode, 0, drafted.stderr)
                self.assertEqual(drafted.stdout, plain.stdout, f"{t} {sampling}")
                m = re.search(r"\(drafts: (\d+) of (\d+) ids taken\)", drafted.stderr)
                self.assertIsNotNone(m, drafted.stderr)
                self.assertGreater(int(m.group(2)), 0, f"{t} {sampling}: no draft checked")
                taken += int(m.group(1))
                counts.append(f"{t}{' seeded' if sampling else ''} {m.group(1)}/{m.group(2)}")
        print("\ndraft ids taken / checked: " + ", ".join(counts), file=sys.stderr)
        self.assertGreater(taken, 0)

    def test_vlm_images_through_mmproj_equal_the_folder(self):
        src = os.path.join(FIX, "tiny-f32")
        model, mmproj = os.path.join(self.tmp, "tiny-f32.gguf"), os.path.join(self.tmp, "mmproj-tiny-f32.gguf")
        convert(src, model, "f32", "--mmproj-out", mmproj, "--mmproj-type", "f32", "--projection-type", "f32")
        from PIL import Image
        img = os.path.join(self.tmp, "img.png")
        Image.fromarray((np.random.default_rng(3).random((40, 56, 3)) * 255).astype("uint8")).save(img)
        args = ("--image", img, "--prompt", "Describe")
        a = vlm_dump([src], os.path.join(self.tmp, "img-st"), *args)
        b = vlm_dump([model, "--mmproj", mmproj], os.path.join(self.tmp, "img-gguf"), *args)
        # The folder holding the model and its mmproj file opens the same way.
        folder = os.path.join(self.tmp, "tiny-f32-gguf")
        os.makedirs(folder)
        for f in (model, mmproj):
            os.symlink(f, os.path.join(folder, os.path.basename(f)))
        c = vlm_dump([folder], os.path.join(self.tmp, "img-folder"), *args)
        # The model file alone has no vision tower: the error says where a GGUF model's is.
        refused(self, ["run", "--model", model, *args, "--max-tokens", "1"], "no vision tower", "--mmproj")
        with open(os.path.join(a, "tokens.json")) as f:
            tokens = json.load(f)
        self.assertIn(262144, tokens)  # image rows are there
        ea = np.load(os.path.join(a, "inputs_embeds.npy"))
        for out in (b, c):
            with open(os.path.join(out, "tokens.json")) as f:
                self.assertEqual(json.load(f), tokens)
            # Image rows (SigLIP + projector from the mmproj) and text rows: the decoder config differs (tiny-f32's
            # layer pattern is not llama.cpp's), so the merged embeddings are what is compared.
            self.assertLessEqual(float(np.abs(np.load(os.path.join(out, "inputs_embeds.npy")) - ea).max()), 1e-5)

    def test_refusals_name_the_tensor(self):
        ids = ["--tokens", "[2, 1000, 1001]", "--ids", "--max-tokens", "2"]
        f32, q8 = self.files["f32"], self.files["q8_0"]
        missing = patch_tensor_info(f32, os.path.join(self.tmp, "missing.gguf"), "blk.3.ffn_up.weight",
                                    new_name="blk.3.ffn_xx.weight")
        refused(self, ["run", "--model", missing, *ids], "missing tensor 'blk.3.ffn_up.weight'")
        shape = patch_tensor_info(f32, os.path.join(self.tmp, "shape.gguf"), "blk.2.attn_q.weight", ne1=255)
        refused(self, ["run", "--model", shape, *ids], "blk.2.attn_q.weight", "has shape [255, 256]")
        iq2 = patch_tensor_info(q8, os.path.join(self.tmp, "iq2_xxs.gguf"), "blk.1.ffn_down.weight", type_id=16)
        refused(self, ["run", "--model", iq2, *ids], "blk.1.ffn_down.weight", "IQ2_XXS", "not supported")
        two = os.path.join(self.tmp, "two")
        os.makedirs(two)
        for t in ("f32", "q8_0"):
            os.symlink(self.files[t], os.path.join(two, os.path.basename(self.files[t])))
        refused(self, ["run", "--model", two, *ids], "2 model .gguf files")

    def test_prompt_cache_from_another_quantization_refused(self):
        cache = os.path.join(self.tmp, "q8.cache")
        run = ["run", "--tokens", "[2, 1000, 1001, 1002]", "--ids", "--max-tokens", "2", "--prompt-cache", cache]
        r = subprocess.run([BIN, *run[:1], "--model", self.files["q8_0"], *run[1:]], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = subprocess.run([BIN, *run[:1], "--model", self.files["q8_0"], *run[1:]], capture_output=True, text=True)
        self.assertIn("reusing", r.stderr)
        refused(self, [*run[:1], "--model", self.files["q4_k"], *run[1:]], "another model identity",
                "weight_dtypes (text=F32+Q8_0 vs text=F32+Q4_K)")

    # ---- vlm quantize ----
    def test_vlm_quantize_q8_0_equals_the_converter(self):
        out = os.path.join(self.tmp, "vq-q8_0.gguf")
        r = subprocess.run([BIN, "quantize", "--model", self.lc["f32"], "--type", "q8_0", "--out", out],
                           capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr)
        # Q8_0 is ggml's reference rule in both writers: every tensor and key byte for byte the same.
        meta, ts = gguf_writer.read(out)
        want_meta, want = gguf_writer.read(self.files["q8_0"])
        self.assertEqual(set(ts), set(want))
        for k in want:
            self.assertEqual(ts[k], want[k], k)
        self.assertEqual({k: v for k, v in meta.items() if k != "general.name"},
                         {k: v for k, v in want_meta.items() if k != "general.name"})

    @unittest.skipUnless(os.path.isdir(NODE_LLAMA), "node-llama-cpp not installed (npm install in tools/npm)")
    def test_vlm_quantize_files_run_in_llama_cpp_like_in_vlm(self):
        # 45 prompt rows: within every block format's dot_rows (96 and more), so the prefill runs the int8
        # kernels under either precision, whatever route the CPU gives longer bf16 prefills (the
        # dequantize-to-bf16 GEMM past dot_rows: Quant.Bf16PrecisionPrefillRoundsDequantizedWeights);
        # decode is int8 either way.
        prompt = [2] + [1000 + 37 * i % 7000 for i in range(44)]
        n = 12
        report = {}
        lc288 = os.path.join(self.tmp, "lc-f32-288")
        make_lc(lc288, "f32", hidden=288)
        cases = [(self.lc["f32"], t) for t in ("q8_0", "q4_0", "q4_1", "q2_k", "q3_k_s", "q3_k_m", "q3_k_l", "q4_k_m",
                                               "q5_k_m", "iq4_xs")] + \
                [(lc288, t) for t in ("q3_k_m", "q4_k_m", "q5_k_m", "iq4_xs")]
        for src, t in cases:
            wide = src == lc288
            path = os.path.join(self.tmp, f"vq-{t}{'-288' if wide else ''}.gguf")
            r = subprocess.run([BIN, "quantize", "--model", src, "--type", t, "--out", path],
                               capture_output=True, text=True, timeout=600)
            self.assertEqual(r.returncode, 0, r.stderr)
            meta, ts = gguf_writer.read(path)
            kinds = {v[0] for k, v in ts.items() if len(v[1]) == 2}
            # llama.cpp's mixes: Q4_K_M (Q5_K_M) = Q4_K (Q5_K) with Q6_K for the head and attn_v/ffn_down of
            # layers 2 and 5 of 6; IQ4_XS with a Q6_K head (6 layers: no ffn_down in the first eighth; 2 query
            # heads per KV head: attn_v stays IQ4_XS); Q2_K: attn_v, attn_output and ffn_down Q3_K; Q3_K_M:
            # attn_v of layers 0-1 Q5_K, the other attn_v, attn_output and ffn_down Q4_K; Q3_K_L: those Q5_K
            want = {"q8_0": {"q8_0"}, "q4_0": {"q4_0", "q6_k"}, "q4_1": {"q4_1", "q6_k"}, "q2_k": {"q2_k", "q3_k", "q6_k"},
                    "q3_k_s": {"q3_k", "q6_k"}, "q3_k_m": {"q3_k", "q4_k", "q5_k", "q6_k"},
                    "q3_k_l": {"q3_k", "q5_k", "q6_k"}, "q4_k_m": {"q4_k", "q6_k"},
                    "q5_k_m": {"q5_k", "q6_k"}, "iq4_xs": {"iq4_xs", "q6_k"}}[t]
            if wide:  # rows of 288, not whole 256-blocks, fall back as llama.cpp's: Q3_K -> Q4_0, Q4_K -> Q5_0,
                # Q5_K -> Q5_1, Q6_K -> Q8_0, IQ4_XS -> IQ4_NL
                fb = {"q3_k": "q4_0", "q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0", "iq4_xs": "iq4_nl"}
                for name, (gtype, shape, _) in ts.items():
                    if len(shape) == 2:
                        self.assertEqual(gtype in fb.values(), shape[1] == 288, f"{t} {name} {gtype} {shape}")
                # (the head is 288 wide: Q8_0; Q6_K stays in ffn_down of layers 2 and 5, 512 wide)
                # (Q3_K_M: attn_output and ffn_down keep Q4_K, 256 and 512 wide)
                want = {"q3_k_m": {"q4_0", "q5_0", "q5_1", "q4_k", "q8_0"}, "q4_k_m": {"q4_k", "q6_k", "q5_0", "q8_0"},
                        "q5_k_m": {"q5_k", "q6_k", "q5_1", "q8_0"}, "iq4_xs": {"iq4_xs", "iq4_nl", "q8_0"}}[t]
            self.assertEqual(kinds, want, t)
            if t in ("q4_k_m", "q5_k_m") and not wide:
                six = sorted(k for k, v in ts.items() if v[0] == "q6_k")
                self.assertEqual(six, ["blk.2.attn_v.weight", "blk.2.ffn_down.weight", "blk.5.attn_v.weight",
                                       "blk.5.ffn_down.weight", "token_embd.weight"])
            if t == "q3_k_m" and not wide:
                self.assertEqual(sorted(k for k, v in ts.items() if v[0] == "q5_k"), ["blk.0.attn_v.weight", "blk.1.attn_v.weight"])
            t = f"{t}{'-288' if wide else ''}"
            lc = llama(path, {"logits": [prompt], "generate": [{"ids": prompt, "n": n}]})
            theirs = np.array(lc["logits"][0], dtype=np.float64)
            logits = {}
            for precision in ("bf16", "f32"):
                out = vlm_dump([path], os.path.join(self.tmp, f"vq-dump-{t}-{precision}"), "--tokens",
                               json.dumps(prompt), "--precision", precision)
                with open(os.path.join(out, "identity.json")) as f:
                    self.assertEqual(json.load(f)["fields"]["precision"], precision)
                mine = logits[precision] = np.load(os.path.join(out, "logits.npy"))
                diff = float(np.abs(mine - theirs).max())
                report[f"{t} {precision}"] = (round(diff, 4), int((mine.argmax(-1) == theirs.argmax(-1)).sum()),
                                              lc["generate"][0] == vlm_greedy(path, prompt, n))
            # Both precisions ran the int8 kernels; what differs is the KV cache, bf16 rows under bf16
            # (docs/gemma3/decoder.md, "KV cache"): the logits move (measured 0.19-0.30 at logits of ~20 on
            # these random weights, as far as llama.cpp with its f16 cache is from either) within the bound
            # below.
            kv = round(float(np.abs(logits["bf16"] - logits["f32"]).max()), 4)
            report[f"{t} kv"] = kv
            self.assertGreater(kv, 0.0, t)
            self.assertLess(kv, 0.5, t)
        print(f"\nvlm vs llama.cpp on vlm quantize's files (max |dlogit|, top-1 of {len(prompt)}, greedy equal): "
              f"{report}", file=sys.stderr)
        for t, r in report.items():
            if t.endswith(" kv"):
                continue
            diff, top1, greedy = r
            # Same weights on both sides; what differs is the activation rounding (vlm: int8 per 32, or bf16 x and
            # weights in a bf16 prefill; llama.cpp: Q8_0 per 32, Q8_K per 256 for the K-quants) and ggml's f16
            # GELU table. Bound: 0.5 at logits of ~20 (2.5%), a fifth of what Q4 quantization itself moves them
            # (docs/gguf.md §6: 2.5 vs f32).
            self.assertLess(diff, 0.5, t)
            self.assertEqual(top1, len(prompt), t)
            self.assertTrue(greedy, t)


if __name__ == "__main__":
    unittest.main()
