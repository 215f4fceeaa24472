"""The oracle's SigLIP vision tower and Gemma 3 projector (docs/gemma3/vision.md), NumPy in float64.

    raw, feats = encode(model_dir, pixel_values)   # [n, P, Hv], [n, T, H]

Weights come from the oracle reader (st.py) exactly as stored; pixel values are first rounded to
the weight dtype, as HF casts pixel_values to the tower's dtype before the patch convolution
(docs/gemma3/preprocessing.md#dtype). Everything after that is float64, so the result is the
math of docs/gemma3/vision.md with no rounding of ours: the engine's float32 result is compared
to it with stated tolerances.

    raw, feats = encode(model_dir, pixel_values, precision="bf16")

models the engine's --precision bf16 from its definition (src/kernels/exec.h, src/nn/attention.h,
docs/gemma3/vision.md#precision): the input of every matrix product is taken as float32 and
rounded to bfloat16 (nearest even) -- the rows entering each weight, and in attention the
queries (already multiplied by the f32 scale), keys, values and probabilities -- while the
weights, the sums and everything else stay float64.
"""
import numpy as np

from st import load_checkpoint


def round_to(x, dtype):
    """float32 values rounded to the storage dtype (round to nearest even), back as float32."""
    x = np.asarray(x, np.float32)
    if dtype == "F16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "BF16":
        u = x.view(np.uint32).astype(np.uint64)
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        return (u.astype(np.uint32) << 16).view(np.float32)
    return x


def layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)  # biased
    return (x - mean) / np.sqrt(var + eps) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def inputs(precision):
    """What a matrix product does to its inputs: nothing, or (bf16) round them through float32."""
    assert precision in ("f32", "bf16"), precision
    if precision == "f32":
        return lambda t: t
    return lambda t: round_to(np.asarray(t, np.float32), "BF16").astype(np.float64)


def siglip(pv, W, v, pixel_dtype, precision="f32"):
    """pv [n, 3, S, S] float32 -> post-layernorm hidden states [n, P, D] float64."""
    n, S, p, D, nh = pv.shape[0], v["image_size"], v["patch_size"], v["hidden_size"], v["num_heads"]
    g = S // p
    rin = inputs(precision)
    x = round_to(pv, pixel_dtype).astype(np.float64)
    # Conv2d(kernel p, stride p) = one product per patch: [n, g, g, 3·p·p] in (c, ky, kx) order.
    patches = x.reshape(n, 3, g, p, g, p).transpose(0, 2, 4, 1, 3, 5).reshape(n, g * g, 3 * p * p)
    f = lambda k: W[k].astype(np.float64)
    h = rin(patches) @ f("vision.embeddings.patch_embedding.weight").reshape(D, -1).T
    h = h + f("vision.embeddings.patch_embedding.bias") + f("vision.embeddings.position_embedding.weight")
    eps, hd = v["layer_norm_eps"], D // nh
    scale = float(np.float32(1.0 / np.sqrt(hd)))  # the engine scales q by the f32 scale
    for i in range(v["num_layers"]):
        e = f"vision.encoder.layers.{i}."
        lin = lambda t, m: rin(t) @ f(e + m + ".weight").T + f(e + m + ".bias")
        a = layer_norm(h, f(e + "layer_norm1.weight"), f(e + "layer_norm1.bias"), eps)
        q, k, vv = (lin(a, "self_attn." + m).reshape(n, -1, nh, hd).transpose(0, 2, 1, 3)
                    for m in ("q_proj", "k_proj", "v_proj"))
        att = rin(softmax(rin(q * scale) @ rin(k).transpose(0, 1, 3, 2))) @ rin(vv)  # no mask
        h = h + lin(att.transpose(0, 2, 1, 3).reshape(n, -1, D), "self_attn.out_proj")
        a = layer_norm(h, f(e + "layer_norm2.weight"), f(e + "layer_norm2.bias"), eps)
        h = h + lin(gelu_tanh(lin(a, "mlp.fc1")), "mlp.fc2")
    return layer_norm(h, f("vision.post_layernorm.weight"), f("vision.post_layernorm.bias"), eps)


def projector(raw, W, v, tokens, precision="f32"):
    """docs/gemma3/vision.md#projector: average pool to sqrt(T)², Gemma RMSNorm (1 + w),
    then x · W ([in, out])."""
    n, P, D = raw.shape
    g = v["image_size"] // v["patch_size"]
    s = int(round(tokens ** 0.5))
    k = g // s
    pooled = raw.reshape(n, s, k, s, k, D).mean(axis=(2, 4)).reshape(n, s * s, D)
    rms = np.sqrt((pooled ** 2).mean(-1, keepdims=True) + v["layer_norm_eps"])
    normed = pooled / rms * (1.0 + W["projector.mm_soft_emb_norm.weight"].astype(np.float64))
    return inputs(precision)(normed) @ W["projector.mm_input_projection_weight"].astype(np.float64)


def encode(model_dir, pv, precision="f32"):
    cfg, tensors, _, _ = load_checkpoint(model_dir)
    W = {k: t.f32() for k, t in tensors.items() if k.startswith(("vision.", "projector."))}
    pixel_dtype = tensors["vision.embeddings.patch_embedding.weight"].dtype
    raw = siglip(pv, W, cfg["vision"], pixel_dtype, precision)
    return raw, projector(raw, W, cfg["vision"], cfg["mm_tokens_per_image"], precision)
