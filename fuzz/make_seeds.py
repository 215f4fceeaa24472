#!/usr/bin/env python3
"""Writes the GGUF seeds of fuzz_gguf_vocab, fuzz_gguf_config and fuzz_gguf_model (docs/gguf.md §3-§5):
seeds/gguf_vocab/ holds two small SentencePiece-style vocabularies, one with all 256 byte pieces and
one without; seeds/gguf_config/ a text file's and an mmproj file's keys as tools/convert_hf_to_gguf.py
writes them, in the target's input layout (u32 length of the text image, the text image, the mmproj);
seeds/gguf_model/ a whole one-layer text model."""
import pathlib
import struct
import sys
import tempfile

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tools"))
from gguf_writer import GGUFWriter  # noqa: E402

seeds = pathlib.Path(__file__).resolve().parent / "seeds"
# (piece, llama.cpp token type): 1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte
head = [("<pad>", 3), ("<eos>", 3), ("<bos>", 3), ("<unk>", 2), ("<start_of_turn>", 4), ("<end_of_turn>", 4),
        ("<start_of_image>", 4), ("<end_of_image>", 4), ("<image_soft_token>", 4)]
normal = ["\u2581", "c", "cc", "cccc", "l", "o", "lo", "\u2581H", "e", "He", "\u2581He", "ll", "llo", "Hello", "\u2581w",
          "\u00f6", "r", "ld", "rld", "\u2581\u2581", "\n", "\t", "!", ",", "\U0001F642"]


def vocab(w, with_bytes):
    pieces = head + [(f"<0x{b:02X}>", 6) for b in range(256) if with_bytes] + [(p, 1) for p in normal]
    w.add("tokenizer.ggml.model", "llama")
    w.add("tokenizer.ggml.add_space_prefix", False)
    w.add("tokenizer.ggml.add_bos_token", True)
    w.add("tokenizer.ggml.tokens", [p for p, _ in pieces], "array:string")
    w.add("tokenizer.ggml.scores", [-float(i) for i in range(len(pieces))], "array:f32")
    w.add("tokenizer.ggml.token_type", [t for _, t in pieces], "array:i32")
    for key, i in (("bos", 2), ("eos", 1), ("unknown", 3), ("padding", 0)):
        w.add(f"tokenizer.ggml.{key}_token_id", i, "u32")


def image(w):
    with tempfile.TemporaryDirectory() as d:
        w.write(pathlib.Path(d) / "f.gguf")
        return (pathlib.Path(d) / "f.gguf").read_bytes()


(seeds / "gguf_vocab").mkdir(parents=True, exist_ok=True)
for name, with_bytes in (("bytes.gguf", True), ("nobytes.gguf", False)):
    w = GGUFWriter()
    w.add("general.architecture", "gemma3")
    vocab(w, with_bytes)
    w.add("tokenizer.chat_template", "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}")
    (seeds / "gguf_vocab" / name).write_bytes(image(w))

text = GGUFWriter()
text.add("general.architecture", "gemma3")
for key, v in (("context_length", 4096), ("embedding_length", 64), ("block_count", 6), ("feed_forward_length", 128),
               ("attention.head_count", 4), ("attention.head_count_kv", 2), ("attention.key_length", 16),
               ("attention.value_length", 16), ("attention.sliding_window", 512)):
    text.add(f"gemma3.{key}", v, "u32")
text.add("gemma3.attention.layer_norm_rms_epsilon", 1e-6, "f32")
text.add("gemma3.rope.freq_base", 1e6, "f32")
text.add("gemma3.rope.scaling.type", "linear")
text.add("gemma3.rope.scaling.factor", 8.0, "f32")
vocab(text, False)
mm = GGUFWriter()
mm.add("general.architecture", "clip")
mm.add("clip.projector_type", "gemma3")
for key, v in (("projection_dim", 64), ("image_size", 64), ("patch_size", 4), ("embedding_length", 32),
               ("feed_forward_length", 64), ("block_count", 2), ("attention.head_count", 2),
               ("projector.scale_factor", 4)):
    mm.add(f"clip.vision.{key}", v, "u32")
mm.add("clip.vision.attention.layer_norm_epsilon", 1e-6, "f32")
mm.add("clip.vision.image_mean", [0.5] * 3, "array:f32")
mm.add("clip.vision.image_std", [0.5] * 3, "array:f32")
(seeds / "gguf_config").mkdir(parents=True, exist_ok=True)
t, m = image(text), image(mm)
(seeds / "gguf_config" / "text.bin").write_bytes(struct.pack("<I", len(t)) + t)
(seeds / "gguf_config" / "text+mmproj.bin").write_bytes(struct.pack("<I", len(t)) + t + m)

# A whole text model of the smallest shapes the loader takes (H 32, one layer, two heads of 16,
# one KV head, I 64), its matrices in every storage type, as fuzz_gguf_model's seed.
rng = np.random.default_rng(0)
model = GGUFWriter()
model.add("general.architecture", "gemma3")
for key, v in (("context_length", 256), ("embedding_length", 32), ("block_count", 1), ("feed_forward_length", 64),
               ("attention.head_count", 2), ("attention.head_count_kv", 1), ("attention.key_length", 16),
               ("attention.value_length", 16)):
    model.add(f"gemma3.{key}", v, "u32")
vocab(model, True)
n_vocab = len(head) + 256 + len(normal)
H, I, d = 32, 64, 16
shapes = [("token_embd.weight", (n_vocab, H), "q8_0"), ("output_norm.weight", (H,), "f32"),
          ("blk.0.attn_norm.weight", (H,), "f32"), ("blk.0.attn_q.weight", (2 * d, H), "q4_1"),
          ("blk.0.attn_k.weight", (d, H), "bf16"), ("blk.0.attn_v.weight", (d, H), "q4_0"),
          ("blk.0.attn_output.weight", (H, 2 * d), "q5_0"), ("blk.0.attn_q_norm.weight", (d,), "f32"),
          ("blk.0.attn_k_norm.weight", (d,), "f32"), ("blk.0.post_attention_norm.weight", (H,), "f32"),
          ("blk.0.ffn_norm.weight", (H,), "f32"), ("blk.0.ffn_gate.weight", (I, H), "q8_0"),
          ("blk.0.ffn_up.weight", (I, H), "q5_1"), ("blk.0.ffn_down.weight", (H, I), "f16"),
          ("blk.0.post_ffw_norm.weight", (H,), "f32")]
for name, shape, gtype in shapes:
    model.add_tensor(name, rng.standard_normal(shape).astype(np.float32) * 0.1, gtype)
(seeds / "gguf_model").mkdir(parents=True, exist_ok=True)
(seeds / "gguf_model" / "tiny.gguf").write_bytes(image(model))
