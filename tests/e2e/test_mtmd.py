"""llama.cpp's multimodal path against vlm, on the same GGUF model and mmproj files, with images.

The peer is libmtmd + libllama built from the source node-llama-cpp bundles (`bench/build_llama.sh
DIR`, about 15 minutes on two cores: more than CI's time allows, so this file runs where
VLM_MTMD_BUILD=DIR names such a build and is skipped otherwise). tests/e2e/peer/mtmd_logits.cpp
drives it: mtmd's own layout around an image (docs/gemma3/prompt.md, Layouts: `<start_of_image>`, the
image rows, `<end_of_image>`, no newlines), its PNG decode, resize and normalization, the image rows
decoded non-causally, then greedy decoding, with an f32 KV cache (llama.cpp's default f16 cache
rounds every key and value). vlm gets the same ids (`--tokens`, the image rows as 262144) and the
same image through `vlm dump`.

The checkpoint is make_checkpoint's tiny-peer: a random Gemma 3 VLM within llama.cpp's fixed rules
whose sliding window (8) is shorter than an image (16 rows), so the sliding layers' mask over the
image matters. For an f32 model + f32 mmproj, a bf16 pair and a Q8_0 model + f32 mmproj:
* mtmd's prompt ids are the ones vlm is given;
* the logits at the prompt's last position and after each of 3 greedy tokens are within the
  file type's BOUND, and the greedy tokens are the same. Measured at logits of about 13: f32
  2.6e-3 to 2.8e-3 (llama.cpp's CPU GELU goes through an f16 table), bf16 4.9e-2 to 5.1e-2 (as far
  as llama.cpp's own results on a bf16 and an f32 mmproj are apart: 4.3e-2), Q8_0 0.16 (as on
  text, docs/gguf.md: activations quantized per block on both sides, rounding apart);
* a square image of another size (100 x 100, which both resize to 64 x 64 with PIL's bilinear
  filter) agrees as well;
* the bound catches a wrong image mask: vlm with a causal mask over the image (`--mask-mode causal`)
  is over 10x the f32 BOUND away (measured 1.2), and another resize filter: vlm given the 100 x 100
  image resized by PIL's bicubic filter is too (0.53), by its bilinear filter it is not.
A non-square image is not compared: mtmd pads it to a square, keeping its aspect ratio, where HF
and vlm stretch it (docs/gemma3/preprocessing.md).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

BIN = os.environ.get("VLM_BIN", "build/vlm")
SRC = os.environ.get("VLM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
MTMD = os.environ.get("VLM_MTMD_BUILD", "")
sys.path.insert(0, os.path.join(SRC, "tools"))
import convert_hf_to_gguf  # noqa: E402
import make_checkpoint  # noqa: E402

BOUND = {"f32": 2e-2, "bf16": 0.2, "q8_0": 0.5}
STEPS = 4  # logits rows: the prompt's last position, then after each of 3 greedy tokens
BOI, EOI, IMAGE = make_checkpoint.BOI, make_checkpoint.EOI, make_checkpoint.IMAGE
# "<start_of_turn>user\n" MARKER "Describe<end_of_turn>\n<start_of_turn>model\n", one image
PROMPT = "<start_of_turn>user\n<__media__>Describe<end_of_turn>\n<start_of_turn>model\n"
ROWS = 16  # tiny's mm_tokens_per_image
IDS = [2, 105, 2364, 107, BOI] + [IMAGE] * ROWS + [EOI, 82858, 106, 107, 105, 4368, 107]


def have_build():
    return bool(MTMD) and os.path.isfile(os.path.join(MTMD, "bin", "libmtmd.so"))


@unittest.skipUnless(have_build(), "VLM_MTMD_BUILD does not name a llama.cpp build (bench/build_llama.sh DIR)")
class Mtmd(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from PIL import Image
        cls.tmp = tempfile.mkdtemp(prefix="vlm-mtmd-")
        cls.driver = os.path.join(cls.tmp, "mtmd_logits")
        inc = [os.path.join(MTMD, "src", p) for p in ("include", "ggml/include", "tools/mtmd")]
        lib = os.path.join(MTMD, "bin")
        subprocess.run(["g++", "-O2", "-std=c++17", os.path.join(SRC, "tests/e2e/peer/mtmd_logits.cpp"),
                        *[f"-I{i}" for i in inc], f"-L{lib}", "-lmtmd", "-lllama", "-lggml", "-lggml-base",
                        f"-Wl,-rpath,{lib}", "-o", cls.driver], check=True)
        cls.models = {}
        for dt in ("f32", "bf16"):
            ck = os.path.join(cls.tmp, f"ck-{dt}")
            make_checkpoint.make("tiny-peer", ck, dt, seed=5)
            for t in (("f32", "q8_0") if dt == "f32" else ("bf16",)):
                model, mmproj = os.path.join(cls.tmp, f"{t}.gguf"), os.path.join(cls.tmp, f"mmproj-{t}.gguf")
                mm = "bf16" if t == "bf16" else "f32"
                convert_hf_to_gguf.main([ck, "--out", model, "--type", t, "--mmproj-out", mmproj,
                                         "--mmproj-type", mm, "--projection-type", "f32"])
                cls.models[t] = (model, mmproj)
        rng = np.random.default_rng(3)
        cls.images = {}
        for name, side in (("exact", 64), ("resized", 100)):
            cls.images[name] = os.path.join(cls.tmp, f"{name}.png")
            Image.fromarray((rng.random((side, side, 3)) * 255).astype("uint8")).save(cls.images[name])

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def peer(self, t, image):
        model, mmproj = self.models[t]
        out = os.path.join(self.tmp, f"peer-{t}-{os.path.basename(image)}.f32")
        r = subprocess.run([self.driver, model, mmproj, PROMPT, str(STEPS), out, image], capture_output=True,
                           text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        got = json.loads(r.stdout.strip().splitlines()[-1])
        return got, np.fromfile(out, dtype=np.float32).reshape(STEPS, -1)

    def vlm(self, t, image, *extra):
        model, mmproj = self.models[t]
        out = os.path.join(self.tmp, f"vlm-{t}-{os.path.basename(image)}-{len(extra)}")
        r = subprocess.run([BIN, "dump", "--model", model, "--mmproj", mmproj, "--tokens", json.dumps(IDS), "--image",
                            image, "--steps", str(STEPS - 1), "--out", out, *extra], capture_output=True, text=True,
                           timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        rows = [np.load(os.path.join(out, "logits.npy"))[-1], *np.load(os.path.join(out, "decode_logits.npy"))]
        with open(os.path.join(out, "greedy.json")) as f:
            return json.load(f), np.stack(rows)

    def test_logits_and_greedy_equal_llama_cpp(self):
        report = {}
        for t in ("f32", "bf16", "q8_0"):
            for name, image in self.images.items():
                with self.subTest(file=t, image=name):
                    got, theirs = self.peer(t, image)
                    self.assertEqual(got["prompt"], [-1 if i == IMAGE else i for i in IDS])
                    greedy, ours = self.vlm(t, image)
                    self.assertEqual(theirs.shape, ours.shape)
                    diff = float(np.abs(theirs - ours).max())
                    report[f"{t}/{name}"] = f"{diff:.2e} at logits of {float(np.abs(theirs).max()):.1f}"
                    self.assertLess(diff, BOUND[t])
                    self.assertEqual(got["tokens"][:STEPS - 1], greedy)
        print(f"\nllama.cpp (mtmd) vs vlm, max |dlogit| over {STEPS} positions: {report}", file=sys.stderr)

    def test_bound_catches_a_causal_image_mask_and_another_resize_filter(self):
        from PIL import Image
        _, theirs = self.peer("f32", self.images["exact"])
        _, ours = self.vlm("f32", self.images["exact"], "--mask-mode", "causal")
        self.assertGreater(float(np.abs(theirs[0] - ours[0]).max()), 10 * BOUND["f32"])
        # vlm given the 100 x 100 image already resized to 64 x 64 by PIL: bilinear is what both
        # do (the same logits), bicubic is not.
        _, theirs = self.peer("f32", self.images["resized"])
        for resample, same in ((Image.BILINEAR, True), (Image.BICUBIC, False)):
            small = os.path.join(self.tmp, f"resized-{resample}.png")
            Image.open(self.images["resized"]).resize((64, 64), resample).save(small)
            _, ours = self.vlm("f32", small)
            diff = float(np.abs(theirs[0] - ours[0]).max())
            if same:
                self.assertLess(diff, BOUND["f32"])
            else:
                self.assertGreater(diff, 10 * BOUND["f32"])


if __name__ == "__main__":
    unittest.main()
