"""`vlm inspect` on hostile model folders: each must exit with status 1 and print exactly
one line, `vlm inspect: error: ...`, naming the file / tensor / field at fault (never a
crash, never a partial result on stdout). The folders are written here from scratch
(a small Gemma3ForCausalLM / Gemma3ForConditionalGeneration), so every byte is controlled.
"""
import json
import os
import shutil
import struct
import subprocess
import tempfile
import unittest

BIN = os.environ.get("VLM_BIN", "build/vlm")

TEXT_CFG = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 64,
    "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 4, "query_pre_attn_scalar": 4, "sliding_window": 4,
    "eos_token_id": [1], "layer_types": ["sliding_attention", "full_attention"],
}


def text_tensors(cfg):
    """(file name, shape) of every tensor a Gemma3ForCausalLM with `cfg` holds
    (docs/gemma3/checkpoint.md#text-tensors)."""
    V, H, I, d = cfg["vocab_size"], cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    out = [("model.embed_tokens.weight", [V, H]), ("model.norm.weight", [H])]
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        out += [(p + k + ".weight", [H]) for k in ("input_layernorm", "post_attention_layernorm",
                                                   "pre_feedforward_layernorm", "post_feedforward_layernorm")]
        out += [(p + "self_attn.q_proj.weight", [q, H]), (p + "self_attn.k_proj.weight", [kv, H]),
                (p + "self_attn.v_proj.weight", [kv, H]), (p + "self_attn.o_proj.weight", [H, q]),
                (p + "self_attn.q_norm.weight", [d]), (p + "self_attn.k_norm.weight", [d]),
                (p + "mlp.gate_proj.weight", [I, H]), (p + "mlp.up_proj.weight", [I, H]),
                (p + "mlp.down_proj.weight", [H, I])]
    return out


def safetensors_bytes(tensors):
    """A valid F32 file: header padded to 8 bytes, tensors back to back."""
    header, data = {}, b""
    for name, shape in tensors:
        n = 1
        for s in shape:
            n *= s
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + 4 * n]}
        data += struct.pack(f"<{n}f", *[(i % 7) / 8 for i in range(n)])
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def raw_file(header_text, data=b""):
    h = header_text.encode()
    h += b" " * (-len(h) % 8)  # keep tensors aligned, so only the intended fault shows
    return struct.pack("<Q", len(h)) + h + data


class InspectErrors(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="vlm-inspect-")

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def folder(self, name, cfg=TEXT_CFG, weights=None, files=None):
        d = os.path.join(self.tmp, name)
        os.makedirs(d)
        if cfg is not None:
            with open(os.path.join(d, "config.json"), "w") as f:
                f.write(cfg if isinstance(cfg, str) else json.dumps(cfg))
        if weights is not None:
            with open(os.path.join(d, "model.safetensors"), "wb") as f:
                f.write(weights)
        for fname, content in (files or {}).items():
            with open(os.path.join(d, fname), "wb") as f:
                f.write(content)
        return d

    def inspect(self, d, *extra):
        return subprocess.run([BIN, "inspect", "--model", d, *extra], capture_output=True, timeout=120)

    def assert_refused(self, d, *fragments):
        r = self.inspect(d, "--json")
        err = r.stderr.decode()
        self.assertEqual(r.returncode, 1, f"exit {r.returncode}, stderr: {err!r}")
        self.assertEqual(r.stdout, b"", "partial output on stdout")
        lines = err.splitlines()
        self.assertEqual(len(lines), 1, f"not one line: {err!r}")
        self.assertTrue(lines[0].startswith("vlm inspect: error: "), lines[0])
        for frag in fragments:
            self.assertIn(frag, lines[0])

    def test_valid_folder_is_accepted(self):
        d = self.folder("ok", weights=safetensors_bytes(text_tensors(TEXT_CFG)))
        r = self.inspect(d, "--json")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        j = json.loads(r.stdout)
        self.assertEqual(j["naming"], "causal_lm")
        self.assertEqual(j["text"]["layer_kinds"], ["sliding", "global"])
        self.assertEqual(len(j["tensors"]), len(text_tensors(TEXT_CFG)))

    def test_truncated_file(self):
        full = safetensors_bytes(text_tensors(TEXT_CFG))
        self.assert_refused(self.folder("trunc", weights=full[:-5]), "model.safetensors", "past the data section")
        self.assert_refused(self.folder("tiny", weights=full[:5]), "model.safetensors", "truncated")

    def test_header_length_larger_than_file(self):
        self.assert_refused(self.folder("hlen", weights=struct.pack("<Q", 4096) + b"{}"),
                            "model.safetensors", "header length 4096")

    def test_header_not_json(self):
        self.assert_refused(self.folder("notjson", weights=raw_file("{not json}")), "model.safetensors",
                            "not valid JSON")

    def test_unknown_dtype(self):
        w = raw_file('{"model.norm.weight":{"dtype":"I8","shape":[8],"data_offsets":[0,8]}}', b"\0" * 8)
        self.assert_refused(self.folder("i8", weights=w), "model.safetensors", "model.norm.weight", "I8")

    def test_shape_overflow(self):
        w = raw_file('{"x":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}}', b"\0" * 8)
        self.assert_refused(self.folder("ovf", weights=w), "'x'", "overflows")

    def test_offsets_past_end(self):
        w = raw_file('{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}', b"\0" * 8)
        self.assert_refused(self.folder("past", weights=w), "'x'", "past the data section")

    def test_overlapping_tensors(self):
        w = raw_file('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                     '"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', b"\0" * 12)
        self.assert_refused(self.folder("overlap", weights=w), "'a'", "'b'", "overlap")

    def test_missing_shard(self):
        tensors = text_tensors(TEXT_CFG)
        index = {"weight_map": {n: "model-00001-of-00002.safetensors" for n, _ in tensors[:5]}}
        index["weight_map"].update({n: "model-00002-of-00002.safetensors" for n, _ in tensors[5:]})
        d = self.folder("shard", files={"model.safetensors.index.json": json.dumps(index).encode(),
                                        "model-00001-of-00002.safetensors": safetensors_bytes(tensors[:5])})
        self.assert_refused(d, "model.safetensors.index.json", "model-00002-of-00002.safetensors", "missing")

    def test_wrong_shape_for_config(self):
        tensors = [(n, [16, 4] if n == "model.layers.1.self_attn.k_proj.weight" else s)
                   for n, s in text_tensors(TEXT_CFG)]
        self.assert_refused(self.folder("shape", weights=safetensors_bytes(tensors)),
                            "model.layers.1.self_attn.k_proj.weight", "[16, 4]", "expected [4, 8]")

    def test_missing_tensor(self):
        tensors = [t for t in text_tensors(TEXT_CFG) if t[0] != "model.layers.0.mlp.up_proj.weight"]
        self.assert_refused(self.folder("missing", weights=safetensors_bytes(tensors)),
                            "model.layers.0.mlp.up_proj.weight")

    def test_config_missing_required_field(self):
        cfg = dict(TEXT_CFG)
        del cfg["hidden_size"]
        self.assert_refused(self.folder("nohidden", cfg=cfg, weights=b""), "config.json", "hidden_size",
                            "missing required field")

    def test_config_inconsistent_field(self):
        cfg = dict(TEXT_CFG, layer_types=["sliding_attention"])
        self.assert_refused(self.folder("lt", cfg=cfg), "config.json", "layer_types", "num_hidden_layers is 2")
        self.assert_refused(self.folder("badjson", cfg="{"), "config.json", "not valid JSON")

    def test_not_a_model_folder(self):
        self.assert_refused(self.folder("empty", cfg=None), "not a model folder")
        self.assert_refused(os.path.join(self.tmp, "absent"), "absent", "not a directory")
        self.assert_refused(self.folder("noweights"), "no model.safetensors")


if __name__ == "__main__":
    unittest.main()
