"""The oracle's own safetensors and checkpoint-folder reader, NumPy only
(docs/gemma3/config.md#files, docs/gemma3/checkpoint.md).

    cfg, tensors = load_checkpoint(dir)          # tensors: {canonical name: Tensor}
    w = tensors["text.layers.0.mlp.up_proj.weight"].f32()

Canonical names: `text.<rest>` (decoder), `lm_head.weight` (explicit head only), `vision.<rest>`
(SigLIP, after `vision_model.`), `projector.<rest>`. Deliberately simple and trusting: it reads
what docs/gemma3/checkpoint.md says a valid checkpoint holds; rejecting hostile files is the C++ reader's job.
"""
import json
import os
import struct

import numpy as np

from cfg import read_config

# safetensors dtype -> (element size, little-endian numpy dtype of the raw words)
DTYPES = {"F32": (4, "<f4"), "F16": (2, "<f2"), "BF16": (2, "<u2")}


class Tensor:
    """One tensor of a checkpoint: where it lives and its raw little-endian bytes."""

    def __init__(self, file_name, path, dtype, shape, begin, end):
        self.file_name = file_name  # name as written in the file
        self.path = path            # absolute path of the .safetensors file
        self.dtype = dtype          # "F32" | "F16" | "BF16"
        self.shape = list(shape)
        self.begin, self.end = begin, end  # absolute byte offsets in the file

    @property
    def nbytes(self):
        return self.end - self.begin

    @property
    def numel(self):
        return int(np.prod(self.shape, dtype=np.int64))

    def raw(self):
        """The stored bytes as a read-only uint8 array (memory-mapped)."""
        if self.nbytes == 0:
            return np.zeros(0, np.uint8)
        return np.memmap(self.path, np.uint8, "r", offset=self.begin, shape=(self.nbytes,))

    def f32(self):
        """Values as float32, exactly (bf16 and f16 widen without rounding)."""
        words = self.raw().view(DTYPES[self.dtype][1])
        if self.dtype == "BF16":
            x = (words.astype(np.uint32) << 16).view(np.float32)
        else:
            x = words.astype(np.float32)
        return x.reshape(self.shape)


def read_header(path):
    """(header dict without __metadata__, absolute offset of the data section)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header, 8 + n


def read_file_tensors(path):
    """{file name: Tensor} for one .safetensors file."""
    header, data = read_header(path)
    out = {}
    for name, h in header.items():
        esize = DTYPES[h["dtype"]][0]
        b, e = h["data_offsets"]
        assert e - b == esize * int(np.prod(h["shape"], dtype=np.int64)), (path, name)
        out[name] = Tensor(name, path, h["dtype"], h["shape"], data + b, data + e)
    return out


def model_files(d):
    """The weight files of a checkpoint folder: the single file, or the shards index.json names."""
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            wm = json.load(f)["weight_map"]
        return [os.path.join(d, s) for s in sorted(set(wm.values()))], wm
    return [os.path.join(d, "model.safetensors")], None


# docs/gemma3/checkpoint.md#naming: file-name prefixes of each naming scheme, mapped to canonical prefixes.
SCHEMES = {
    "old": [("language_model.model.", "text."), ("language_model.lm_head.", "lm_head."),
            ("vision_tower.vision_model.", "vision."), ("multi_modal_projector.", "projector.")],
    "new": [("model.language_model.", "text."), ("lm_head.", "lm_head."),
            ("model.vision_tower.vision_model.", "vision."), ("model.multi_modal_projector.", "projector.")],
    "causal_lm": [("model.", "text."), ("lm_head.", "lm_head.")],
}


def canonical(file_name, scheme):
    for full, short in SCHEMES[scheme]:
        if file_name.startswith(full):
            return short + file_name[len(full):]
    return None


def detect_naming(names, is_vlm):
    if not is_vlm:
        return "causal_lm"
    if any(n.startswith("language_model.model.") for n in names):
        return "old"
    return "new"


def ignored(name):
    """Tensors to skip silently (docs/gemma3/checkpoint.md#naming): a SigLIP pooling head, rotary buffers."""
    return name.startswith("vision.head.") or name.endswith("rotary_emb.inv_freq")


def load_checkpoint(d):
    """(config dict from cfg.read_config, {canonical name: Tensor}, naming, unknown file names).

    Tensors docs/gemma3/checkpoint.md names for this config become canonical; those it says to ignore
    are dropped; every other tensor is returned (by file name) in `unknown`.
    """
    cfg = read_config(d)
    files, weight_map = model_files(d)
    by_name = {}
    for p in files:
        for name, t in read_file_tensors(p).items():
            assert name not in by_name, f"{name} appears in two files"
            if weight_map is not None:
                assert weight_map.get(name) == os.path.basename(p), f"{name}: index.json disagrees"
            by_name[name] = t
    naming = detect_naming(by_name, cfg["arch"] == "ConditionalGeneration")
    expected = set(expected_shapes(cfg))
    tensors, unknown = {}, []
    for name, t in by_name.items():
        c = canonical(name, naming)
        if c in expected:
            tensors[c] = t
        elif not ignored(c or name):
            unknown.append(name)
    return cfg, tensors, naming, sorted(unknown)


def expected_shapes(cfg, explicit_head=True):
    """{canonical name: shape} of every tensor docs/gemma3/checkpoint.md lists for this config.

    `lm_head.weight` is optional (tied to the embedding when absent); it is included here.
    """
    t = cfg["text"]
    H, I, d = t["hidden_size"], t["intermediate_size"], t["head_dim"]
    q, kv = t["num_heads"] * d, t["num_kv_heads"] * d
    out = {"text.embed_tokens.weight": [t["vocab_size"], H], "text.norm.weight": [H]}
    for n in range(t["num_layers"]):
        p = f"text.layers.{n}."
        out.update({
            p + "input_layernorm.weight": [H],
            p + "self_attn.q_proj.weight": [q, H],
            p + "self_attn.k_proj.weight": [kv, H],
            p + "self_attn.v_proj.weight": [kv, H],
            p + "self_attn.o_proj.weight": [H, q],
            p + "self_attn.q_norm.weight": [d],
            p + "self_attn.k_norm.weight": [d],
            p + "post_attention_layernorm.weight": [H],
            p + "pre_feedforward_layernorm.weight": [H],
            p + "mlp.gate_proj.weight": [I, H],
            p + "mlp.up_proj.weight": [I, H],
            p + "mlp.down_proj.weight": [H, I],
            p + "post_feedforward_layernorm.weight": [H],
        })
    if explicit_head:
        out["lm_head.weight"] = [t["vocab_size"], H]
    v = cfg["vision"]
    if v is not None:
        D, F, ps = v["hidden_size"], v["intermediate_size"], v["patch_size"]
        out.update({
            "vision.embeddings.patch_embedding.weight": [D, v["num_channels"], ps, ps],
            "vision.embeddings.patch_embedding.bias": [D],
            "vision.embeddings.position_embedding.weight": [(v["image_size"] // ps) ** 2, D],
            "vision.post_layernorm.weight": [D],
            "vision.post_layernorm.bias": [D],
            "projector.mm_input_projection_weight": [D, H],  # [in, out]
            "projector.mm_soft_emb_norm.weight": [D],
        })
        for n in range(v["num_layers"]):
            e = f"vision.encoder.layers.{n}."
            for m, shape_w, shape_b in (("layer_norm1", None, [D]), ("layer_norm2", None, [D]),
                                        ("self_attn.q_proj", [D, D], [D]), ("self_attn.k_proj", [D, D], [D]),
                                        ("self_attn.v_proj", [D, D], [D]), ("self_attn.out_proj", [D, D], [D]),
                                        ("mlp.fc1", [F, D], [F]), ("mlp.fc2", [D, F], [D])):
                out[e + m + ".weight"] = shape_w or [D]
                out[e + m + ".bias"] = shape_b
    return out


def part_of(canonical_name):
    """'text' | 'vision' | 'projector' (lm_head counts as text)."""
    head = canonical_name.split(".", 1)[0]
    return "text" if head in ("text", "lm_head") else head


def load_f32(d):
    """(config, {canonical name: float32 array}) — the form the math oracles use."""
    cfg, tensors, _, _ = load_checkpoint(d)
    return cfg, {k: t.f32() for k, t in tensors.items()}


def fnv1a64(data):
    """FNV-1a 64-bit hash of a byte string, as 16 lowercase hex digits (pure Python, ~75 ns/byte)."""
    h, prime, mask = 0xCBF29CE484222325, 0x100000001B3, 0xFFFFFFFFFFFFFFFF
    for b in bytes(data):
        h = ((h ^ b) * prime) & mask
    return f"{h:016x}"
