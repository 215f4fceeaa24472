"""`vlm bench --json` on the tiny VLM fixture: the last line is one JSON object holding every
figure the issue names, each finite and positive (no timing is judged: that is the bench's
job, not a test's); a GGUF model with its --mmproj file benches the same way; a bad option value
is a one-line error."""
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

BIN = os.environ.get("VLM_BIN")
FIXTURES = os.environ.get("VLM_FIXTURES")
SRC = os.environ.get("VLM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
FIELDS = ["pp_tok_s", "tg_tok_s", "image_s", "batch_tok_s", "rss_bytes", "roofline_tg_tok_s", "peak_gflops",
          "read_gb_s", "weight_bytes_per_token", "peak_f32_gflops", "weights_read_gb_s",
          "tg_fraction_of_weights_read", "tg_median_step_s", "load_s", "first_token_s", "batch_limit_tok_s",
          "pp_cold_s"]


@unittest.skipUnless(BIN and FIXTURES, "VLM_BIN and VLM_FIXTURES must be set")
class TestBench(unittest.TestCase):
    def bench(self, *extra, model=None, env=None):
        model = model or [os.path.join(FIXTURES, "tiny-bf16")]
        r = subprocess.run([BIN, "bench", "--model", *model, "--threads", "2",
                            "--pp", "40", "--tg", "8", "--batch", "3", "--image", "--json", *extra],
                           capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})})
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr

    def test_json_fields_positive_and_finite(self):
        j, log = self.bench("--draft", "3")
        for f in FIELDS:
            self.assertIn(f, j)
            self.assertIsInstance(j[f], (int, float), f)
            self.assertTrue(math.isfinite(j[f]) and j[f] > 0, f"{f} = {j[f]}")
        self.assertEqual(j["precision"], "bf16")  # the default for a bf16 checkpoint
        self.assertEqual((j["pp"], j["tg"], j["batch"], j["threads"]), (40, 8, 3, 2))
        # The roofline is the probe's bandwidth over the bytes one step reads: weights and KV rows.
        self.assertAlmostEqual(j["roofline_tg_tok_s"],
                               j["read_gb_s"] * 1e9 / (j["weight_bytes_per_token"] + j["kv_bytes_per_token"]),
                               delta=1e-6 * j["roofline_tg_tok_s"])
        # Every decode step's time: their mean is the decode rate's, the best and median among them.
        steps = j["tg_step_s"]
        self.assertEqual(len(steps), j["tg"])
        self.assertAlmostEqual(sum(steps) / len(steps), 1.0 / j["tg_tok_s"], delta=1e-9 * sum(steps))
        self.assertEqual(j["tg_best_step_s"], min(steps))
        self.assertEqual(j["tg_median_step_s"], sorted(steps)[len(steps) // 2])
        # A batch's limit is B tokens per weight read at most, less where its FLOPs take longer.
        self.assertLessEqual(j["batch_limit_tok_s"],
                             j["batch"] * j["read_gb_s"] * 1e9 / j["weight_bytes_per_token"] * (1 + 1e-9))
        # The decode test again with drafts: the same number of tokens, some draft ids taken or not.
        self.assertEqual(j["draft"], 3)
        self.assertTrue(math.isfinite(j["draft_tok_s"]) and j["draft_tok_s"] > 0)
        self.assertLessEqual(j["draft_ids_taken"], j["draft_ids"])
        for word in ("start:", "prefill:", "decode:", "sampling", "weights read where they are mapped:",
                     "batched decode:", "decode with drafts of up to 3 ids:", "image:", "peak RSS:"):
            self.assertIn(word, log)
        # What sampling one token takes, greedy and drawn (no timing judged).
        for f in ("greedy", "temperature_1", "top_k_64_top_p_0.95"):
            self.assertTrue(math.isfinite(j["sample_ms"][f]) and j["sample_ms"][f] > 0, f)

    def test_gguf_model_and_mmproj(self):
        sys.path.insert(0, os.path.join(SRC, "tools"))
        import convert_hf_to_gguf
        with tempfile.TemporaryDirectory() as d:
            model, mmproj = os.path.join(d, "tiny.gguf"), os.path.join(d, "mmproj-tiny.gguf")
            convert_hf_to_gguf.main([os.path.join(FIXTURES, "tiny-bf16"), "--out", model, "--type", "bf16",
                                     "--mmproj-out", mmproj, "--mmproj-type", "bf16"])
            j, _ = self.bench("--mmproj", mmproj, model=[model])
            self.assertEqual(j["model"], model)
            self.assertEqual(j["precision"], "bf16")
            self.assertTrue(math.isfinite(j["image_s"]) and j["image_s"] > 0)

    def test_depth_counts_the_kv_rows_decode_reads(self):
        # Decode after a 40-token prompt: each step reads every cached position's keys and values
        # on a global layer and the last W on a sliding one (bf16 rows under bf16), on top of the
        # weights; from config.json, not from vlm.
        j, log = self.bench("--depth", "40")
        self.assertEqual(j["depth"], 40)
        with open(os.path.join(FIXTURES, "tiny-bf16", "config.json")) as f:
            c = json.load(f)["text_config"]
        row = 2 * c["num_key_value_heads"] * c["head_dim"] * 2
        layers = c["num_hidden_layers"]
        glob = [(l + 1) % c["sliding_window_pattern"] == 0 for l in range(layers)]
        want = sum(row * (40 + i + 1 if g else min(40 + i + 1, c["sliding_window"]))
                   for i in range(8) for g in glob) / 8
        self.assertAlmostEqual(j["kv_bytes_per_token"], want, delta=1e-9 * want)
        self.assertIn("after 40 prompt tokens", log)
        r = subprocess.run([BIN, "bench", "--model", os.path.join(FIXTURES, "tiny-bf16"), "--depth", "1020",
                            "--tg", "8"], capture_output=True, text=True, timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--depth", r.stderr)

    def test_precision_f32_and_bad_values(self):
        j, _ = self.bench("--precision", "f32")
        self.assertEqual(j["precision"], "f32")
        r = subprocess.run([BIN, "bench", "--model", os.path.join(FIXTURES, "tiny-bf16"), "--pp", "0"],
                           capture_output=True, text=True, timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--pp", r.stderr)
        r = subprocess.run([BIN, "bench", "--model", os.path.join(FIXTURES, "tiny-text-bf16"), "--image"],
                           capture_output=True, text=True, timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("no vision tower", r.stderr)

    def test_vlm_isa_picks_the_kernel_path(self):
        # As for run and dump: a forced path (scalar: every CPU has it) runs in place of the best one;
        # a bad name is a one-line error.
        j, _ = self.bench(env={"VLM_ISA": "scalar"})
        self.assertEqual(j["isa"], "scalar")
        r = subprocess.run([BIN, "bench", "--model", os.path.join(FIXTURES, "tiny-bf16"), "--pp", "8", "--tg", "2"],
                           capture_output=True, text=True, timeout=60, env={**os.environ, "VLM_ISA": "sse9"})
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("VLM_ISA=sse9", r.stderr)


if __name__ == "__main__":
    unittest.main()
