#!/usr/bin/env python3
"""Converts a Gemma 3 Hugging Face folder (safetensors) into llama.cpp's GGUF files.

    /usr/bin/python3 tools/convert_hf_to_gguf.py DIR --out model.gguf [--type f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|q2_k|q3_k|q4_k|q5_k|q6_k|iq4_nl|iq4_xs]
        [--mmproj-out mmproj.gguf] [--mmproj-type f16|f32|bf16|q8_0]

The text file uses llama.cpp's `gemma3` architecture keys and tensor names, the mmproj file the
`clip` architecture with projector type `gemma3`; docs/gguf.md lists every key and name and the
upstream source each follows. Norm weights of the Gemma RMSNorms are stored as 1 + w (computed in
f32); 1-D tensors stay f32; the patch and position embeddings f32 and the projection f16 in the
mmproj, as llama.cpp's converter forces them. Matrices whose row length is not a multiple of the
quantized block size stay in --fallback-type (f16 by default), as llama.cpp's quantizer does.
The tokenizer keys (SentencePiece-style, `tokenizer.ggml.model = llama`) come from tokenizer.json:
piece scores are the negated rank of the first BPE merge that makes the piece, so merging the
highest-scoring pair reproduces the BPE merge order.
"""
import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_writer  # noqa: E402

# ------------------------------------------------------------------ safetensors reading

ST_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}


class Lazy:
    """A tensor read when called (as f32; bf16 widened exactly), so that a checkpoint larger
    than memory converts one tensor at a time. `then(fn)` is the same tensor mapped by fn."""

    def __init__(self, shape, load):
        self.shape, self.ndim, self._load = tuple(shape), len(shape), load

    def __call__(self):
        return self._load()

    def then(self, fn):
        return Lazy(self.shape, lambda: fn(self._load()))


def read_safetensors(path):
    """{name: Lazy} of one file."""
    out = {}
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)

    def load(e):
        b, end = e["data_offsets"]
        raw = np.frombuffer(data[b:end], dtype=ST_DTYPES[e["dtype"]])
        if e["dtype"] == "BF16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        return raw.astype(np.float32).reshape(e["shape"])

    for name, e in header.items():
        if name != "__metadata__":
            out[name] = Lazy(e["shape"], lambda e=e: load(e))
    return out


def read_folder(d):
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    if not files:
        raise SystemExit(f"convert_hf_to_gguf: no .safetensors files in {d}")
    tensors = {}
    for f in files:
        tensors.update(read_safetensors(os.path.join(d, f)))
    return tensors


def strip_prefix(name):
    """Canonical names: text.<...>, vision.<...>, projector.<...>, lm_head.weight or None."""
    for pre, short in (("model.language_model.", "text."), ("language_model.model.", "text."),
                       ("model.vision_tower.vision_model.", "vision."), ("vision_tower.vision_model.", "vision."),
                       ("model.multi_modal_projector.", "projector."), ("multi_modal_projector.", "projector."),
                       ("language_model.lm_head.", "lm_head."), ("lm_head.", "lm_head."), ("model.", "text.")):
        if name.startswith(pre):
            return short + name[len(pre):]
    return None


# ------------------------------------------------------------------ text model

TEXT_NAMES = {  # HF (after `layers.N.`) -> llama.cpp (after `blk.N.`), gguf-py constants.py
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}


def text_name(canonical):
    rest = canonical[len("text."):]
    if rest == "embed_tokens.weight":
        return "token_embd.weight"
    if rest == "norm.weight":
        return "output_norm.weight"
    parts = rest.split(".", 2)
    if parts[0] == "layers" and parts[2] in TEXT_NAMES:
        return f"blk.{parts[1]}.{TEXT_NAMES[parts[2]]}"
    raise SystemExit(f"convert_hf_to_gguf: no GGUF name for text tensor '{canonical}'")


def storage_type(x, want, fallback):
    if x.ndim == 1:
        return "f32"
    be = gguf_writer.GGML_TYPES[want][1]
    return want if x.shape[-1] % be == 0 else fallback


FILE_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q2_k": 10, "q3_k": 11,
             "q4_k": 15, "q5_k": 17, "q6_k": 18, "iq4_nl": 25, "iq4_xs": 30, "bf16": 32}


def add_tokenizer(w, d, n_vocab):
    with open(os.path.join(d, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    try:
        with open(os.path.join(d, "tokenizer_config.json"), encoding="utf-8") as f:
            tcfg = json.load(f)
    except FileNotFoundError:
        tcfg = {}
    model = tok["model"]
    if model.get("type") != "BPE":
        raise SystemExit(f"convert_hf_to_gguf: tokenizer.json model type {model.get('type')!r} is not BPE")
    pieces = dict(model["vocab"])
    added = {a["content"]: a for a in tok.get("added_tokens", [])}
    for a in added.values():
        pieces[a["content"]] = a["id"]
    n = max(max(pieces.values()) + 1, n_vocab or 0)
    if n_vocab is not None and n > n_vocab:
        # Ids beyond the embedding rows (Gemma 3's <image_soft_token>) cannot be looked up: dropped.
        n = n_vocab
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [5] * n  # unused
    scores = [-1000.0] * n
    for text, i in pieces.items():
        if i < n:
            tokens[i], types[i], scores[i] = text, 1, 0.0
    for rank, m in enumerate(model["merges"]):
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        i = pieces.get(a + b)
        if i is not None and i < n and scores[i] == 0.0:
            scores[i] = -float(rank + 1)
    for i, text in enumerate(tokens):
        if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            types[i] = 6  # byte
    for text, a in added.items():
        i = a["id"]
        if i < n:
            types[i] = (2 if text == model.get("unk_token") else 3) if a["special"] else 4
    w.add("tokenizer.ggml.model", "llama")
    w.add("tokenizer.ggml.pre", "default")
    w.add("tokenizer.ggml.tokens", tokens, "array:string")
    w.add("tokenizer.ggml.scores", scores, "array:f32")
    w.add("tokenizer.ggml.token_type", types, "array:i32")

    def special(key, name):
        text = tcfg.get(name)
        if isinstance(text, dict):
            text = text.get("content")
        if text in pieces and pieces[text] < n:
            w.add(f"tokenizer.ggml.{key}_token_id", pieces[text], "u32")

    special("bos", "bos_token")
    special("eos", "eos_token")
    special("unknown", "unk_token")
    special("padding", "pad_token")
    w.add("tokenizer.ggml.add_bos_token", bool(tcfg.get("add_bos_token", True)))
    w.add("tokenizer.ggml.add_eos_token", bool(tcfg.get("add_eos_token", False)))
    w.add("tokenizer.ggml.add_space_prefix", False)
    if tcfg.get("chat_template"):
        w.add("tokenizer.chat_template", tcfg["chat_template"])


def write_text(d, cfg, tensors, out, gtype, fallback):
    t = cfg.get("text_config", cfg)
    g = lambda k, default=None: t.get(k, default)  # noqa: E731
    w = gguf_writer.GGUFWriter()
    w.add("general.architecture", "gemma3")
    w.add("general.type", "model")
    w.add("general.name", os.path.basename(os.path.normpath(d)))
    w.add("general.file_type", FILE_TYPE[gtype], "u32")
    if gtype.startswith("q"):
        w.add("general.quantization_version", 2, "u32")
    w.add("gemma3.context_length", g("max_position_embeddings", 131072), "u32")
    w.add("gemma3.embedding_length", g("hidden_size"), "u32")
    w.add("gemma3.block_count", g("num_hidden_layers"), "u32")
    w.add("gemma3.feed_forward_length", g("intermediate_size"), "u32")
    w.add("gemma3.attention.head_count", g("num_attention_heads", 8), "u32")
    w.add("gemma3.attention.head_count_kv", g("num_key_value_heads", 4), "u32")
    w.add("gemma3.attention.key_length", g("head_dim", 256), "u32")
    w.add("gemma3.attention.value_length", g("head_dim", 256), "u32")
    w.add("gemma3.attention.layer_norm_rms_epsilon", float(g("rms_norm_eps", 1e-6)), "f32")
    w.add("gemma3.rope.freq_base", float(g("rope_theta", 1000000.0)), "f32")
    if g("sliding_window_pattern", 6) != 1:
        w.add("gemma3.attention.sliding_window", g("sliding_window", 4096), "u32")
    rs = g("rope_scaling")
    if rs:
        w.add("gemma3.rope.scaling.type", rs.get("rope_type", rs.get("type", "linear")))
        w.add("gemma3.rope.scaling.factor", float(rs["factor"]), "f32")

    embed = tensors["text.embed_tokens.weight"]
    add_tokenizer(w, d, embed.shape[0])
    for c in sorted((c for c in tensors if c.startswith("text.")), key=_text_order):
        x = tensors[c]
        if c.endswith("norm.weight"):
            x = x.then(lambda a: (a + np.float32(1)).astype(np.float32))  # Gemma3RMSNorm's (1 + w)
        w.add_tensor(text_name(c), x, storage_type(x, gtype, fallback))
    if "lm_head.weight" in tensors:  # untied head (llama.cpp: optional `output.weight`)
        w.add_tensor("output.weight", tensors["lm_head.weight"], storage_type(tensors["lm_head.weight"], gtype, fallback))
    w.write(out)


def _text_order(c):
    if c.startswith("text.layers."):
        n, rest = c[len("text.layers."):].split(".", 1)
        return (1, int(n), rest)
    return (0 if "embed" in c else 2, 0, c)


# ------------------------------------------------------------------ mmproj (vision tower + projector)

VISION_NAMES = {
    "layer_norm1": "ln1", "layer_norm2": "ln2", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.out_proj": "attn_out", "mlp.fc1": "ffn_up", "mlp.fc2": "ffn_down",
}


def vision_name(c):
    if c == "vision.embeddings.patch_embedding.weight":
        return "v.patch_embd.weight"
    if c == "vision.embeddings.patch_embedding.bias":
        return "v.patch_embd.bias"
    if c == "vision.embeddings.position_embedding.weight":
        return "v.position_embd.weight"
    if c.startswith("vision.post_layernorm."):
        return "v.post_ln." + c.rsplit(".", 1)[1]
    if c == "projector.mm_input_projection_weight":
        return "mm.input_projection.weight"
    if c == "projector.mm_soft_emb_norm.weight":
        return "mm.soft_emb_norm.weight"
    if c.startswith("vision.encoder.layers."):
        n, rest = c[len("vision.encoder.layers."):].split(".", 1)
        mod, kind = rest.rsplit(".", 1)
        if mod in VISION_NAMES:
            return f"v.blk.{n}.{VISION_NAMES[mod]}.{kind}"
    raise SystemExit(f"convert_hf_to_gguf: no GGUF name for vision tensor '{c}'")


def write_mmproj(d, cfg, tensors, out, gtype, projection_type="f16"):
    v = cfg["vision_config"]
    H = cfg["text_config"]["hidden_size"]
    w = gguf_writer.GGUFWriter()
    w.add("general.architecture", "clip")
    w.add("general.type", "mmproj")
    w.add("general.file_type", FILE_TYPE[gtype], "u32")
    w.add("clip.has_vision_encoder", True)
    w.add("clip.projector_type", "gemma3")
    w.add("clip.vision.projection_dim", H, "u32")
    w.add("clip.vision.image_size", v["image_size"], "u32")
    w.add("clip.vision.patch_size", v["patch_size"], "u32")
    w.add("clip.vision.embedding_length", v["hidden_size"], "u32")
    w.add("clip.vision.feed_forward_length", v["intermediate_size"], "u32")
    w.add("clip.vision.block_count", v["num_hidden_layers"], "u32")
    w.add("clip.vision.attention.head_count", v["num_attention_heads"], "u32")
    w.add("clip.vision.attention.layer_norm_epsilon", float(v.get("layer_norm_eps", 1e-6)), "f32")
    pp = {}
    if os.path.exists(os.path.join(d, "preprocessor_config.json")):
        with open(os.path.join(d, "preprocessor_config.json")) as f:
            pp = json.load(f)
    w.add("clip.vision.image_mean", [float(x) for x in pp.get("image_mean", [0.5] * 3)], "array:f32")
    w.add("clip.vision.image_std", [float(x) for x in pp.get("image_std", [0.5] * 3)], "array:f32")
    w.add("clip.use_gelu", True)
    tokens = cfg.get("mm_tokens_per_image", 256)
    merge = (v["image_size"] // v["patch_size"]) // math.isqrt(tokens)
    if merge != 4:
        w.add("clip.vision.projector.scale_factor", merge, "u32")
    for c in sorted((c for c in tensors if c.startswith(("vision.", "projector."))), key=_vision_order):
        x = tensors[c]
        name = vision_name(c)
        if c == "projector.mm_soft_emb_norm.weight":
            x = x.then(lambda a: (a + np.float32(1)).astype(np.float32))  # Gemma3RMSNorm's (1 + w); SigLIP norms are plain
        if ".embeddings." in c:
            t = "f32"
        elif name == "mm.input_projection.weight":
            t = projection_type
        else:
            t = storage_type(x, gtype, "f16")
        w.add_tensor(name, x, t)
    w.write(out)


def _vision_order(c):
    if c.startswith("vision.encoder.layers."):
        n, rest = c[len("vision.encoder.layers."):].split(".", 1)
        return (1, int(n), rest)
    return (0 if c.startswith("vision.embeddings") else 2, 0, c)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--out", required=True)
    ap.add_argument("--type", default="f16", choices=sorted(gguf_writer.GGML_TYPES))
    ap.add_argument("--fallback-type", default="f16", choices=["f32", "f16", "bf16"])
    ap.add_argument("--mmproj-out")
    ap.add_argument("--mmproj-type", default="f16", choices=sorted(gguf_writer.GGML_TYPES))
    ap.add_argument("--projection-type", default="f16", choices=("f16", "f32"),
                    help="mm.input_projection.weight (llama.cpp's converter: f16; f32 keeps an f32 checkpoint exact)")
    ap.add_argument("--vocab-only", action="store_true",
                    help="write only the tokenizer keys (DIR needs just tokenizer.json, tokenizer_config.json)")
    a = ap.parse_args(argv)
    if a.vocab_only:
        w = gguf_writer.GGUFWriter()
        w.add("general.architecture", "gemma3")
        add_tokenizer(w, a.dir, None)
        w.write(a.out)
        return
    with open(os.path.join(a.dir, "config.json")) as f:
        cfg = json.load(f)
    tensors = {}
    for name, x in read_folder(a.dir).items():
        c = strip_prefix(name)
        if c is None:
            raise SystemExit(f"convert_hf_to_gguf: unexpected tensor '{name}'")
        tensors[c] = x
    if cfg.get("text_config", cfg).get("tie_word_embeddings", cfg.get("tie_word_embeddings", True)):
        tensors.pop("lm_head.weight", None)  # tied: llama.cpp reads token_embd for the output
    write_text(a.dir, cfg, tensors, a.out, a.type, a.fallback_type)
    if a.mmproj_out:
        if "vision_config" not in cfg:
            raise SystemExit("convert_hf_to_gguf: --mmproj-out needs a Gemma3ForConditionalGeneration folder")
        write_mmproj(a.dir, cfg, tensors, a.mmproj_out, a.mmproj_type, a.projection_type)


if __name__ == "__main__":
    main()
