"""`vlm run` / `vlm dump` from the command line: chat-templated prompts, streaming text,
Ctrl-C, and the text path on both VLM and CausalLM checkpoints."""
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import unittest

from server_util import sanitized

BIN = os.environ.get("VLM_BIN")
FIXTURES = os.environ.get("VLM_FIXTURES")
# docs/gemma3/prompt.md#chat-template: "Hello" in one user turn with the generation prompt.
HELLO_IDS = [2, 105, 2364, 107, 9259, 106, 107, 105, 4368, 107]


@unittest.skipUnless(BIN and FIXTURES, "VLM_BIN and VLM_FIXTURES must be set")
class TestRun(unittest.TestCase):
    def model(self, name):
        return os.path.join(FIXTURES, name)

    def test_prompt_uses_chat_template(self):
        for name in ("tiny-bf16", "tiny-text-f32"):
            with tempfile.TemporaryDirectory() as out:
                subprocess.run([BIN, "dump", "--model", self.model(name), "--prompt", "Hello", "--out", out,
                                "--steps", "2"], check=True, capture_output=True, timeout=300)
                with open(os.path.join(out, "tokens.json")) as f:
                    self.assertEqual(json.load(f), HELLO_IDS)

    def test_raw_prompt_is_not_templated(self):
        with tempfile.TemporaryDirectory() as out:
            subprocess.run([BIN, "dump", "--model", self.model("tiny-text-f32"), "--prompt", "Hello", "--raw",
                            "--out", out, "--steps", "1"], check=True, capture_output=True, timeout=300)
            with open(os.path.join(out, "tokens.json")) as f:
                # "Hello" with special tokens: docs/gemma3/prompt.md#test-vectors
                self.assertEqual(json.load(f), [2, 9259])

    def test_text_equals_detokenized_ids(self):
        """The streamed text is the detokenization of the ids the same greedy run produces."""
        m = self.model("tiny-text-bf16")
        ids = subprocess.run([BIN, "run", "--model", m, "--prompt", "Hi", "--max-tokens", "8", "--ids"],
                             check=True, capture_output=True, text=True, timeout=300).stdout.split()
        text = subprocess.run([BIN, "run", "--model", m, "--prompt", "Hi", "--max-tokens", "8"],
                              check=True, capture_output=True, text=True, timeout=300).stdout
        want = subprocess.run([BIN, "detokenize", "--model", m, "--skip-special", json.dumps([int(i) for i in ids])],
                              capture_output=True, text=True, timeout=300)
        if want.returncode != 0:
            self.skipTest(f"vlm detokenize unavailable: {want.stderr.strip()}")
        self.assertEqual(text.rstrip("\n"), want.stdout.rstrip("\n"))

    def test_drafts_leave_the_answer_as_it_is(self):
        """`--draft 4`: the same ids, greedy and with a seed, on the text and the VLM checkpoints;
        the last line counts the draft ids checked and taken (some, over the four runs)."""
        taken = 0
        for name in ("tiny-text-f32", "tiny-f32"):
            for sampling in ([], ["--temperature", "1", "--seed", "5"]):
                run = [BIN, "run", "--model", self.model(name), "--prompt", "Say it again and again",
                       "--max-tokens", "40", "--ids", *sampling]
                plain = subprocess.run(run, check=True, capture_output=True, text=True, timeout=300)
                drafted = subprocess.run(run + ["--draft", "4"], check=True, capture_output=True, text=True,
                                         timeout=300)
                self.assertEqual(drafted.stdout, plain.stdout, f"{name} {sampling}")
                self.assertEqual(len(plain.stdout.split()), 40)
                self.assertNotIn("drafts:", plain.stderr)
                m = re.search(r"\(drafts: (\d+) of (\d+) ids taken\), finish: length\]", drafted.stderr)
                self.assertIsNotNone(m, drafted.stderr)
                self.assertLessEqual(int(m.group(1)), int(m.group(2)))
                taken += int(m.group(1))
        self.assertGreater(taken, 0)

    def test_the_stop_string_that_ended_it_is_named(self):
        m = self.model("tiny-text-f32")
        run = [BIN, "run", "--model", m, "--prompt", "Hi", "--max-tokens", "12", "--temperature", "0"]
        full = subprocess.run(run, check=True, capture_output=True, text=True, timeout=300)
        self.assertIn("finish: length]", full.stderr)
        text = full.stdout.rstrip("\n")
        stop = text[3:5]
        self.assertEqual(len(stop), 2, text)
        cut = subprocess.run(run + ["--stop", "never seen", "--stop", stop], check=True, capture_output=True,
                             text=True, timeout=300)
        self.assertEqual(cut.stdout.rstrip("\n"), text[:text.find(stop)])
        self.assertIn(f"finish: stop at {json.dumps(stop, ensure_ascii=False)}]", cut.stderr)

    def test_ctrl_c_stops_cleanly(self):
        p = subprocess.Popen([BIN, "run", "--model", self.model("tiny-text-f32"), "--prompt", "Hi",
                              "--max-tokens", "1000", "--ids", "--threads", "1"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Signal only once the first id is out: the handler is installed by then, however
        # slow the machine is (a fixed sleep raced the model load under load).
        first = os.read(p.stdout.fileno(), 1).decode()  # unbuffered: communicate() reads the fd
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        out = first + out
        self.assertEqual(p.returncode, 130, err)
        self.assertIn("finish: cancelled", err)
        produced = out.split()
        self.assertGreater(len(produced), 0)
        self.assertLess(len(produced), 1000)
        self.assertIn(f"{len(produced)} generated", err)

    def test_prompt_needs_tokenizer_or_tokens(self):
        r = subprocess.run([BIN, "run", "--model", self.model("tiny-f32")], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 1)
        self.assertIn("exactly one of --prompt", r.stderr)

    def test_mlock_past_the_memlock_limit_is_a_clear_error(self):
        """--mlock where the kernel refuses (a 64 KiB memlock limit, and for root no CAP_IPC_LOCK):
        exit 1 naming the bytes, the limit and the remedy, before any output."""
        if sanitized():
            self.skipTest("the sanitizers' runtimes make mlock a no-op")
        if not shutil.which("prlimit") or (os.geteuid() == 0 and not shutil.which("setpriv")):
            self.skipTest("prlimit (and setpriv for root) from util-linux needed")
        drop = ["setpriv", "--bounding-set=-ipc_lock"] if os.geteuid() == 0 else []
        r = subprocess.run([*drop, "prlimit", "--memlock=65536:65536", BIN, "run", "--model", self.model("tiny-f32"),
                            "--prompt", "Hi", "--max-tokens", "2", "--mlock"], capture_output=True, text=True,
                           timeout=300)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertEqual(r.stdout, "")
        self.assertRegex(r.stderr, r"cannot lock the [0-9.]+ GB of weights in memory: .*memlock limit is 64 KiB.*ulimit -l")
        ok = subprocess.run([BIN, "run", "--model", self.model("tiny-f32"), "--prompt", "Hi", "--max-tokens", "2",
                             "--mlock", "--ids"], capture_output=True, text=True, timeout=300)
        self.assertEqual(ok.returncode, 0, ok.stderr)


if __name__ == "__main__":
    unittest.main()
