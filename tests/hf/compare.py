"""vlm dump outputs against Hugging Face transformers on the same random f32 checkpoints.

    python3 tests/hf/compare.py WORK   (WORK as tests/hf/check.sh leaves it)

Needs torch and transformers (the lent device machine has both; CI's Debian has neither, so CI
never runs this: tests/oracle is the check that runs everywhere). Exits 1 on any mismatch:
prompt ids and PIL-path pixel values must be equal, every compared array within 1e-5 of the
largest HF magnitude, greedy tokens equal.
"""
import json
import sys
import traceback

import numpy as np
import torch
import transformers
from PIL import Image

TOL = 1e-5  # relative to the largest |HF| value of the array, as the NumPy oracle's tests
IMAGE_TOKEN = 262144  # docs/gemma3/prompt.md#special-tokens
PROMPT_IMAGE = "Describe this image in detail."
PROMPT_TEXT = "Why is the sky blue? Answer in one sentence."
failures = []


def check(name, ours, ref):
    a, b = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    if a.shape != b.shape:
        failures.append(name)
        print(f"  FAIL {name}: shape ours {a.shape}, HF {b.shape}")
        return
    scale = max(np.abs(b).max(), 1e-30)
    rel = np.abs(a - b).max() / scale
    ok = rel <= TOL
    if not ok:
        failures.append(name)
    print(f"  {'ok  ' if ok else 'FAIL'} {name}: {a.shape}, max|diff| / max|HF| = {rel:.2e}")


def same(name, ours, ref):
    ok = list(ours) == list(ref)
    if not ok:
        failures.append(name)
    print(f"  {'ok  ' if ok else 'FAIL'} {name}: {'equal' if ok else f'ours {list(ours)}, HF {list(ref)}'}")


def section(title, fn):
    print(f"== {title}", flush=True)
    try:
        fn()
    except Exception:
        failures.append(title)
        traceback.print_exc(file=sys.stdout)


def hidden(dump, states, layers):
    # HF's hidden_states: the embeddings, then each layer's output, the last one after the final
    # norm; ours: each layer's output (tools' dump, before any final norm). The last layer's is
    # therefore seen through the logits.
    for i in range(layers - 1):
        check(f"hidden_{i}", np.load(f"{dump}/hidden_{i}.npy"), states[i + 1][0].numpy())


def decode(model, dump, feed):
    """Greedy through HF generate; HF's full-sequence logits at the decode positions."""
    ours = json.load(open(f"{dump}/greedy.json"))
    n = len(ours)
    L = feed["input_ids"].shape[1]
    same("greedy tokens", ours, model.generate(**feed, max_new_tokens=n, do_sample=False)[0, L:].tolist())
    full = dict(feed)
    full["input_ids"] = torch.cat([feed["input_ids"], torch.tensor([ours[:-1]])], 1)
    full["attention_mask"] = torch.ones_like(full["input_ids"])
    if "token_type_ids" in full:
        full["token_type_ids"] = (full["input_ids"] == IMAGE_TOKEN).long()
    logits = model(**full).logits[0].numpy()
    # decode_logits[k] is the step fed greedy[k]: the full sequence's row L + k.
    check("decode logits", np.load(f"{dump}/decode_logits.npy")[: n - 1], logits[L: L + n - 1])


def token_list(ids):
    """apply_chat_template(tokenize=True)'s ids, whether it returns a list or an encoding."""
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    return ids[0] if ids and isinstance(ids[0], list) else ids


def text_feed(ids):
    return {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}


def vlm(work):
    from transformers import AutoProcessor, Gemma3ForConditionalGeneration
    d, dump = f"{work}/tiny", f"{work}/dump-image"
    ours_ids = json.load(open(f"{dump}/tokens.json"))
    ours_pixels = np.load(f"{dump}/pixel_values.npy")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT_IMAGE}]}]
    proc = AutoProcessor.from_pretrained(d, use_fast=False)  # the PIL image processor: the reference resize
    # The random folder keeps its template in tokenizer_config.json only; the text starts with
    # <bos>, so no second one is added.
    text = proc.apply_chat_template(messages, chat_template=proc.tokenizer.chat_template,
                                    add_generation_prompt=True, tokenize=False)
    feed = dict(proc(text=text, images=[Image.open(f"{work}/image.png").convert("RGB")], return_tensors="pt",
                     add_special_tokens=False))
    same("prompt ids (processor)", ours_ids, feed["input_ids"][0].tolist())
    check("pixel values (PIL processor)", ours_pixels, feed["pixel_values"].numpy())
    if np.abs(ours_pixels - feed["pixel_values"].numpy()).max() != 0:
        failures.append("pixel values not exact")
    model = Gemma3ForConditionalGeneration.from_pretrained(d, dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    seen = {}
    inner = model.model
    inner.vision_tower.register_forward_hook(lambda m, a, o: seen.__setitem__("vision", o.last_hidden_state))
    inner.multi_modal_projector.register_forward_hook(lambda m, a, o: seen.__setitem__("projector", o))
    inner.language_model.register_forward_pre_hook(
        lambda m, a, kw: seen.__setitem__("embeds", kw["inputs_embeds"]), with_kwargs=True)
    out = model(**feed, output_hidden_states=True)
    check("SigLIP output", np.load(f"{dump}/vision_raw.npy"), seen["vision"].numpy())
    check("projector output", np.load(f"{dump}/image_features.npy"), seen["projector"].numpy())
    check("merged embeddings", np.load(f"{dump}/inputs_embeds.npy"), seen["embeds"][0].numpy())
    hidden(dump, out.hidden_states, model.config.text_config.num_hidden_layers)
    check("prompt logits", np.load(f"{dump}/logits.npy"), out.logits[0].numpy())
    decode(model, dump, feed)

    # A text-only request on the VLM checkpoint.
    dump = f"{work}/dump-vlm-text"
    ours = json.load(open(f"{dump}/tokens.json"))
    ids = proc.tokenizer.apply_chat_template([{"role": "user", "content": [{"type": "text", "text": PROMPT_TEXT}]}],
                                             add_generation_prompt=True, tokenize=True)
    same("text-only prompt ids", ours, token_list(ids))
    check("text-only prompt logits", np.load(f"{dump}/logits.npy"), model(**text_feed(ours)).logits[0].numpy())
    decode(model, dump, text_feed(ours))


def text(work):
    from transformers import AutoTokenizer, Gemma3ForCausalLM
    d, dump = f"{work}/tiny-text", f"{work}/dump-text"
    ours = json.load(open(f"{dump}/tokens.json"))
    ids = AutoTokenizer.from_pretrained(d).apply_chat_template(
        [{"role": "user", "content": PROMPT_TEXT}], add_generation_prompt=True, tokenize=True)
    same("prompt ids", ours, token_list(ids))
    model = Gemma3ForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    out = model(**text_feed(ours), output_hidden_states=True)
    hidden(dump, out.hidden_states, model.config.num_hidden_layers)
    check("prompt logits", np.load(f"{dump}/logits.npy"), out.logits[0].numpy())
    decode(model, dump, text_feed(ours))


def main():
    work = sys.argv[1]
    torch.set_grad_enabled(False)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    section("Gemma3ForConditionalGeneration (tiny, f32): an image prompt, then a text-only one", lambda: vlm(work))
    section("Gemma3ForCausalLM (tiny-text, f32)", lambda: text(work))
    print("FAILED: " + ", ".join(failures) if failures else "all equal within tolerance")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
