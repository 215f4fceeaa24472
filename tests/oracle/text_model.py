"""NumPy Gemma 3 text decoder, float64 activations, written from docs/gemma3/ (merge-and-scaling.md#text,
masks.md#sliding, decoder.md) and the upstream sources they cite.

    m = TextModel(dir)                    # reads weights with st.py (exact f32 widening)
    e = m.embed(ids)                      # post-scale embedding rows (the scaling policy)
    hidden, logits = m.forward(e, kinds_masks=None, head_rows=None)

Every call recomputes the whole sequence: there is no KV cache, so a decode step's logits
are the last row of a full forward over prompt + generated ids. Weights are the stored
values widened exactly (bf16/f16 -> f64 is exact); the only rounding the oracle copies
from the reference is the one that changes values the model sees: the embedding
normalizer and product in the weight dtype (docs/gemma3/merge-and-scaling.md#text). Everything
else runs in float64, so our f32 engine should agree to ~1e-6 relative whatever the weight dtype.

`precision="bf16"` models the engine's --precision bf16 (src/kernels/exec.h), from its
definition: every product with a stored weight matrix (q, k, v, o, gate, up, down, head)
takes its input rows as the float32 activations rounded to bfloat16 (nearest even) and
multiplies them exactly by the stored weights; and the keys (after k-norm and RoPE) and values
are rounded the same way, the bf16 rows of its KV cache (docs/gemma3/decoder.md#kv-cache), which
every query attends to. Queries, scores, probabilities and everything else stay float64.
precision="f32" (default) rounds nothing.

`faults` (tests only) deliberately breaks the math to show the comparisons catch it:
  "scale_head_dim"   attention scale head_dim^-0.5 instead of query_pre_attn_scalar^-0.5
  "double_normalizer" text embeddings multiplied by the normalizer twice
  "no_window"        sliding layers use the global (causal) mask, no sliding window
  "swap_rope"        sliding layers get the global RoPE base/scaling and vice versa
  "f32_cache"        under precision="bf16", keys and values not rounded (an f32 KV cache)
"""
import numpy as np

from st import load_checkpoint


def round_bf16(x):
    """float32 -> nearest-even bfloat16, returned as float32 (docs/README.md conventions)."""
    u = np.atleast_1d(np.asarray(x, np.float32)).view(np.uint32).astype(np.uint64)
    u16 = np.uint64(16)
    u = (u + np.uint64(0x7FFF) + ((u >> u16) & np.uint64(1))) >> u16
    return (u.astype(np.uint32) << np.uint32(16)).view(np.float32).reshape(np.shape(x))


def round_to(x, dtype):
    x = np.asarray(x, np.float32)
    if dtype == "BF16":
        return round_bf16(x)
    if dtype == "F16":
        return x.astype(np.float16).astype(np.float32)
    return x


def rms_norm(x, w, eps):
    """Gemma RMSNorm (docs/gemma3/decoder.md#rmsnorm): x / sqrt(mean(x^2) + eps) * (1 + w)."""
    r = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return r * (1.0 + w)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def causal_masks(n, window):
    """Boolean allowed[q, k] for global and sliding layers of a text prompt
    (docs/gemma3/masks.md#sliding without images)."""
    q = np.arange(n)[:, None]
    k = np.arange(n)[None, :]
    glob = k <= q
    return glob, glob & (q - k < window)


class TextModel:
    def __init__(self, d, faults=(), precision="f32"):
        assert precision in ("f32", "bf16"), precision
        self.bf16 = precision == "bf16"
        cfg, tensors, _, _ = load_checkpoint(d)
        self.cfg = cfg
        self.t = t = cfg["text"]
        self.faults = set(faults)
        w = lambda n: tensors[n].f32().astype(np.float64)
        emb = tensors["text.embed_tokens.weight"]
        self.embed_dtype = emb.dtype
        self.E32 = emb.f32()
        self.E = self.E32.astype(np.float64)
        self.head = w("lm_head.weight") if "lm_head.weight" in tensors else self.E
        self.layers = []
        for i in range(t["num_layers"]):
            p = f"text.layers.{i}."
            self.layers.append({k: w(p + n) for k, n in [
                ("ln_in", "input_layernorm.weight"), ("q", "self_attn.q_proj.weight"),
                ("k", "self_attn.k_proj.weight"), ("v", "self_attn.v_proj.weight"),
                ("o", "self_attn.o_proj.weight"), ("qn", "self_attn.q_norm.weight"),
                ("kn", "self_attn.k_norm.weight"), ("ln_post_attn", "post_attention_layernorm.weight"),
                ("ln_pre_ff", "pre_feedforward_layernorm.weight"), ("gate", "mlp.gate_proj.weight"),
                ("up", "mlp.up_proj.weight"), ("down", "mlp.down_proj.weight"),
                ("ln_post_ff", "post_feedforward_layernorm.weight")]})
        self.norm = w("text.norm.weight")

    # docs/gemma3/merge-and-scaling.md#text: E[id] * embed_scale.to(weight dtype), the product in
    # the weight dtype.
    def normalizer(self):
        return float(round_to(np.float32(np.sqrt(np.float32(self.t["hidden_size"]))), self.embed_dtype))

    def embed(self, ids):
        s = np.float32(self.normalizer())
        rows = self.E32[np.asarray(ids)]
        out = round_to(rows * s, self.embed_dtype)  # bf16*bf16 and f16*f16 are exact in f32
        if "double_normalizer" in self.faults:
            out = round_to(out * s, self.embed_dtype)
        return out.astype(np.float64)

    def mm(self, a, w):
        """a @ w.T for a stored weight w [out, in]; under bf16 precision a is first taken as
        float32 and rounded to bfloat16 (the inputs of the engine's bf16 products)."""
        if self.bf16:
            a = round_bf16(np.asarray(a, np.float32)).astype(np.float64)
        return a @ w.T

    def inv_freq(self, kind):
        """docs/gemma3/decoder.md#rope: 1 / base^(2i/d) in float32, divided by the linear factor
        on global layers."""
        t, d = self.t, self.t["head_dim"]
        if "swap_rope" in self.faults:
            kind = "global" if kind == "sliding" else "sliding"
        base = t["rope_local_base_freq"] if kind == "sliding" else t["rope_theta"]
        factor = 1.0 if kind == "sliding" else t["rope_scaling_factor"]
        expo = np.arange(0, d, 2, dtype=np.float32) / np.float32(d)
        f = np.float32(1.0) / np.power(np.float32(base), expo)
        return (f / np.float32(factor)).astype(np.float64)

    def rope(self, x, pos, kind):
        """Rotate-half RoPE on x [L, heads, d] at positions pos [L]."""
        d = x.shape[-1]
        th = pos[:, None].astype(np.float64) * self.inv_freq(kind)[None, :]  # [L, d/2]
        c, s = np.cos(th)[:, None, :], np.sin(th)[:, None, :]
        a, b = x[..., : d // 2], x[..., d // 2:]
        return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)

    def forward(self, e, masks=None, head_rows=None, first_layer=0):
        """e [L, H] post-scale embeddings (or, with first_layer > 0, the residual stream
        entering that layer). masks: (global, sliding) boolean allowed [L, L] (default: causal
        text masks). Returns (hidden after every layer from first_layer on, logits of head_rows
        — all rows when None)."""
        t = self.t
        L = e.shape[0]
        nH, nKV, d, eps = t["num_heads"], t["num_kv_heads"], t["head_dim"], t["rms_norm_eps"]
        if masks is None:
            masks = causal_masks(L, t["sliding_window"])
        scale = (d if "scale_head_dim" in self.faults else t["query_pre_attn_scalar"]) ** -0.5
        pos = np.arange(L)
        x = np.array(e, np.float64)
        hidden = []
        for lw, kind in zip(self.layers[first_layer:], t["layer_kinds"][first_layer:]):
            allowed = masks[1] if kind == "sliding" and "no_window" not in self.faults else masks[0]
            a = rms_norm(x, lw["ln_in"], eps)
            q = rms_norm(self.mm(a, lw["q"]).reshape(L, nH, d), lw["qn"], eps)
            k = rms_norm(self.mm(a, lw["k"]).reshape(L, nKV, d), lw["kn"], eps)
            v = self.mm(a, lw["v"]).reshape(L, nKV, d)
            q, k = self.rope(q, pos, kind), self.rope(k, pos, kind)
            if self.bf16 and "f32_cache" not in self.faults:  # the cache's rows
                k = round_bf16(np.asarray(k, np.float32)).astype(np.float64)
                v = round_bf16(np.asarray(v, np.float32)).astype(np.float64)
            o = np.empty((L, nH, d))
            for h in range(nH):
                g = h // (nH // nKV)  # docs/gemma3/decoder.md#attention: repeat_kv grouping
                sc = (q[:, h, :] @ k[:, g, :].T) * scale
                sc = np.where(allowed, sc, -np.inf)
                sc -= sc.max(axis=1, keepdims=True)
                p = np.exp(sc)
                p /= p.sum(axis=1, keepdims=True)
                o[:, h, :] = p @ v[:, g, :]
            x = x + rms_norm(self.mm(o.reshape(L, nH * d), lw["o"]), lw["ln_post_attn"], eps)
            f = rms_norm(x, lw["ln_pre_ff"], eps)
            m = self.mm(gelu_tanh(self.mm(f, lw["gate"])) * self.mm(f, lw["up"]), lw["down"])
            x = x + rms_norm(m, lw["ln_post_ff"], eps)
            hidden.append(x.copy())
        rows = x if head_rows is None else x[head_rows]
        logits = self.mm(rms_norm(rows, self.norm, eps), self.head)
        return hidden, logits

    def sample_limit(self):
        """Greedy never picks VLM vocabulary padding: ids >= image_token_id (docs/gemma3/decoder.md#head)."""
        return self.cfg["image_token_id"] if self.cfg["arch"] == "ConditionalGeneration" else None

    def greedy(self, ids, steps):
        """`steps` greedy ids, each from a full recomputation over everything so far."""
        seq, out, lim = list(ids), [], self.sample_limit()
        for _ in range(steps):
            _, lg = self.forward(self.embed(seq), head_rows=[len(seq) - 1])
            row = lg[0] if lim is None else lg[0][:lim]
            out.append(int(np.argmax(row)))
            seq.append(out[-1])
        return out
