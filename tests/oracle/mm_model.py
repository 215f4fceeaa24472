"""The oracle's multimodal prefill, built on text_model.py and vision_model.py
(docs/gemma3/prompt.md#image-expansion, docs/gemma3/merge-and-scaling.md, docs/gemma3/masks.md).

    allowed_g, allowed_s = mask_allowed(mode, ids, valid, Lp, W, image_id)  # boolean [Lp, Lp]
    additive(allowed)                        # float32: 0.0 allowed, lowest finite f32 blocked
    rows = merge(tm, ids, feats, image_id)   # text rows tm.embed(ids), image rows P in order
    full = extend_for_decode(allowed, total, W, sliding)   # prompt block + causal decode rows

Masks are written from the definitions in docs/gemma3/masks.md, not from the engine:
  hf     (docs/gemma3/masks.md#sliding, pinned engine rule) global: k <= q or same image block;
         sliding: that and q - k < W
  mlx    (docs/gemma3/masks.md#modes prepare_inputs_for_multimodal) every valid pair, one mask for all layers
  causal (docs/gemma3/masks.md#sliding without images) k <= q; sliding also q - k < W
In every mode pad keys and pad query rows (index >= valid) are blocked.
"""
import numpy as np

LOWEST = np.finfo(np.float32).min


def image_groups(ids, valid, image_id):
    """docs/gemma3/masks.md#groups: group(j) = ordinal of the maximal run of image tokens
    holding j, -1 for text."""
    img = np.zeros(len(ids), bool)
    img[:valid] = np.asarray(ids[:valid]) == image_id
    starts = img & ~np.concatenate([[False], img[:-1]])
    return np.where(img, np.cumsum(starts) - 1, -1)


def mask_allowed(mode, ids, valid, Lp, window, image_id):
    """(global, sliding) boolean allowed[q, k] for a prompt of `valid` ids right-padded to Lp."""
    q = np.arange(Lp)[:, None]
    k = np.arange(Lp)[None, :]
    ok = (q < valid) & (k < valid)
    if mode == "mlx":
        return ok, ok.copy()
    g = image_groups(list(ids) + [-1] * (Lp - len(ids)), valid, image_id)
    same = (g[:, None] >= 0) & (g[:, None] == g[None, :]) if mode == "hf" else np.zeros((Lp, Lp), bool)
    glob = ((k <= q) | same) & ok
    return glob, glob & (q - k < window)


def additive(allowed):
    return np.where(allowed, np.float32(0.0), LOWEST).astype(np.float32)


def extend_for_decode(allowed, total, window, sliding):
    """The mask a full recomputation over prompt + generated ids must use to equal the
    engine's decode steps: the prefill mask on the prompt block, then plain causal rows
    (docs/gemma3/masks.md#decode: decode has no image overlay; sliding layers keep q - k < W)."""
    n = allowed.shape[0]
    q = np.arange(total)[:, None]
    k = np.arange(total)[None, :]
    out = (k <= q) & ((q - k < window) if sliding else True)
    out[:n, :] = False
    out[:n, :n] = allowed
    return out


def merge(tm, ids, feats, image_id, image_scale=1.0):
    """docs/gemma3/merge-and-scaling.md#text: post-scale text embeddings (the TextModel's
    rounding policy) with the image positions overwritten, in order, by the projector rows
    `feats` [n_img, H] times image_scale (1 = the reference; anything else models a wrong
    policy)."""
    rows = tm.embed(ids)
    pos = np.flatnonzero(np.asarray(ids) == image_id)
    assert len(pos) == feats.shape[0], (len(pos), feats.shape)
    rows[pos] = feats * image_scale
    return rows, pos


def hf_prompt_string(n_images, text, tokens_per_image, system=None):
    """docs/gemma3/prompt.md: the string HF's processor tokenizes for one user turn holding the images
    (first, in order) and then the text, with every <start_of_image> replaced by FULL."""
    full = "\n\n<start_of_image>" + "<image_soft_token>" * tokens_per_image + "<end_of_image>\n\n"
    body = (system.strip() + "\n\n" if system else "") + "<start_of_image>" * n_images + text.strip()
    s = "<bos><start_of_turn>user\n" + body + "<end_of_turn>\n<start_of_turn>model\n"
    return s.replace("<start_of_image>", full)
