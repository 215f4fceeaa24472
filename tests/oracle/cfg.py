"""The oracle's config reading (docs/gemma3/config.md): HF class defaults and layer kinds.

read_config(dir) returns a plain dict whose keys are those of `vlm inspect --json`:
  {"architecture", "arch": "ConditionalGeneration"|"CausalLM",
   "text": {vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads,
            head_dim, query_pre_attn_scalar, rms_norm_eps, max_position_embeddings,
            sliding_window, rope_theta, rope_local_base_freq, rope_scaling_factor,
            layer_kinds: ["sliding"|"global", ...], tie_word_embeddings},
   "vision": {hidden_size, intermediate_size, num_layers, num_heads, num_channels, image_size,
              patch_size, layer_norm_eps} or None,
   "mm_tokens_per_image": int or None, "boi_token_id", "eoi_token_id", "image_token_id"}
"""
import json
import os

# Gemma3TextConfig class defaults (docs/gemma3/config.md#text-config, "HF default" column).
TEXT_DEFAULTS = {
    "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
    "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
    "head_dim": 256, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 131072, "sliding_window": 4096, "rope_theta": 1e6,
    "rope_local_base_freq": 1e4, "rope_scaling": None, "tie_word_embeddings": True,
}
# SiglipVisionConfig class defaults (docs/gemma3/config.md#vision-config).
VISION_DEFAULTS = {
    "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
    "num_attention_heads": 12, "num_channels": 3, "image_size": 224, "patch_size": 16,
    "layer_norm_eps": 1e-6,
}
# Gemma3Config top-level defaults (docs/gemma3/config.md#top-level); the *_index keys have *_id aliases.
TOP_DEFAULTS = {"mm_tokens_per_image": 256, "boi_token_index": 255999,
                "eoi_token_index": 256000, "image_token_index": 262144}


def _get(d, key, defaults):
    v = d.get(key)
    return defaults[key] if v is None else v


def layer_kinds(t, n_layers):
    """docs/gemma3/config.md#layer-kinds: `layer_types` wins; else the legacy pattern P
    (default 6): global iff (i+1) % P == 0."""
    types = t.get("layer_types")
    if types is not None:
        assert len(types) == n_layers, "layer_types length != num_hidden_layers"
        kinds = {"sliding_attention": "sliding", "full_attention": "global"}
        return [kinds[x] for x in types]
    p = t.get("sliding_window_pattern", t.get("_sliding_window_pattern"))
    p = 6 if p is None else p
    return ["global" if (i + 1) % p == 0 else "sliding" for i in range(n_layers)]


def rope(t):
    """(global base, local base, linear factor on global layers) — docs/gemma3/config.md#layer-kinds."""
    params = t.get("rope_parameters")
    if isinstance(params, dict) and "full_attention" in params:
        full, slide = params["full_attention"], params.get("sliding_attention", {})
        factor = full.get("factor", 1.0) if full.get("rope_type", "default") == "linear" else 1.0
        return (full.get("rope_theta", TEXT_DEFAULTS["rope_theta"]),
                slide.get("rope_theta", TEXT_DEFAULTS["rope_local_base_freq"]), float(factor))
    scaling = _get(t, "rope_scaling", TEXT_DEFAULTS)
    factor = 1.0
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        assert kind in ("linear", "default"), f"rope_scaling type {kind}"
        factor = float(scaling.get("factor", 1.0)) if kind == "linear" else 1.0
    return (float(_get(t, "rope_theta", TEXT_DEFAULTS)),
            float(_get(t, "rope_local_base_freq", TEXT_DEFAULTS)), factor)


def text_config(t):
    n = _get(t, "num_hidden_layers", TEXT_DEFAULTS)
    theta, local, factor = rope(t)
    return {
        "vocab_size": _get(t, "vocab_size", TEXT_DEFAULTS),
        "hidden_size": _get(t, "hidden_size", TEXT_DEFAULTS),
        "intermediate_size": _get(t, "intermediate_size", TEXT_DEFAULTS),
        "num_layers": n,
        "num_heads": _get(t, "num_attention_heads", TEXT_DEFAULTS),
        "num_kv_heads": _get(t, "num_key_value_heads", TEXT_DEFAULTS),
        "head_dim": _get(t, "head_dim", TEXT_DEFAULTS),
        "query_pre_attn_scalar": float(_get(t, "query_pre_attn_scalar", TEXT_DEFAULTS)),
        "rms_norm_eps": float(_get(t, "rms_norm_eps", TEXT_DEFAULTS)),
        "max_position_embeddings": _get(t, "max_position_embeddings", TEXT_DEFAULTS),
        "sliding_window": _get(t, "sliding_window", TEXT_DEFAULTS),
        "rope_theta": theta,
        "rope_local_base_freq": local,
        "rope_scaling_factor": factor,
        "layer_kinds": layer_kinds(t, n),
        "tie_word_embeddings": bool(_get(t, "tie_word_embeddings", TEXT_DEFAULTS)),
    }


def vision_config(v):
    return {
        "hidden_size": _get(v, "hidden_size", VISION_DEFAULTS),
        "intermediate_size": _get(v, "intermediate_size", VISION_DEFAULTS),
        "num_layers": _get(v, "num_hidden_layers", VISION_DEFAULTS),
        "num_heads": _get(v, "num_attention_heads", VISION_DEFAULTS),
        "num_channels": _get(v, "num_channels", VISION_DEFAULTS),
        "image_size": _get(v, "image_size", VISION_DEFAULTS),
        "patch_size": _get(v, "patch_size", VISION_DEFAULTS),
        "layer_norm_eps": float(_get(v, "layer_norm_eps", VISION_DEFAULTS)),
    }


def read_config(d):
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    arch = c["architectures"][0]
    if arch == "Gemma3ForConditionalGeneration":
        top = lambda k: c.get(k, c.get(k.replace("_index", "_id"), TOP_DEFAULTS[k]))
        return {
            "architecture": arch, "arch": "ConditionalGeneration",
            "text": text_config(c.get("text_config") or {}),
            "vision": vision_config(c.get("vision_config") or {}),
            "mm_tokens_per_image": top("mm_tokens_per_image"),
            "boi_token_id": top("boi_token_index"), "eoi_token_id": top("eoi_token_index"),
            "image_token_id": top("image_token_index"),
        }
    assert arch == "Gemma3ForCausalLM", f"unsupported architecture {arch}"
    return {"architecture": arch, "arch": "CausalLM", "text": text_config(c), "vision": None,
            "mm_tokens_per_image": None}
