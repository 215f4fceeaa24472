"""`vlm chat`, the terminal conversation, driven through a pipe: every turn answers exactly as `vlm run
--messages` answers the conversation so far, later turns reuse the earlier turns' rows (the prefix
cache) and encode no image twice, and commands and mistakes (/image of a missing file, an unknown
command, an image for a text-only model) leave the conversation going."""
import json
import os
import re
import subprocess
import tempfile
import unittest

from server_util import BIN, FIXTURES, model_dir, png_bytes

STATS = re.compile(r"\[(\d+) prompt tokens, (\d+) of them reused, (\d+) generated")


def chat(model, script, *args):
    p = subprocess.run([BIN, "chat", "--model", model_dir(model), "--threads", "2", *args], input=script,
                       capture_output=True, text=True, timeout=300)
    return p


def run(model, messages, images, *args, cwd):
    path = os.path.join(cwd, "messages.json")
    with open(path, "w") as f:
        json.dump(messages, f)
    cmd = [BIN, "run", "--model", model_dir(model), "--threads", "2", "--messages", path, *args]
    for im in images:
        cmd += ["--image", im]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise AssertionError(p.stderr)
    return p.stdout


@unittest.skipUnless(BIN and FIXTURES, "VLM_BIN and VLM_FIXTURES must be set")
class TestChat(unittest.TestCase):
    def test_turns_answer_as_vlm_run_and_reuse_the_conversation(self):
        with tempfile.TemporaryDirectory() as d:
            img1, img2 = os.path.join(d, "a.png"), os.path.join(d, "b.png")
            with open(img1, "wb") as f:
                f.write(png_bytes(1))
            with open(img2, "wb") as f:
                f.write(png_bytes(2))
            turns = [([img1], "What is this?"), ([], "And its colours?"), ([img2], "Compare the two.")]
            script = ""
            for ims, text in turns:
                script += "".join(f"/image {im}\n" for im in ims) + text + "\n"
            # Sampled, with a seed: each turn is what `vlm run` gives that conversation with the same flags.
            flags = ["--max-tokens", "7", "--temperature", "1", "--seed", "11", "--system", "Be brief."]
            p = chat("tiny-f32", script, *flags)
            self.assertEqual(p.returncode, 0, p.stderr)

            messages, images, want = [{"role": "system", "content": "Be brief."}], [], ""
            for ims, text in turns:
                messages.append({"role": "user", "content": [{"type": "image"} for _ in ims] +
                                 [{"type": "text", "text": text}]})
                images += ims
                answer = run("tiny-f32", messages, images, *[f for f in flags if f != "--system" and f != "Be brief."],
                             cwd=d)
                want += answer
                messages.append({"role": "assistant", "content": answer[:-1]})  # run ends with a newline
            self.assertEqual(p.stdout, want)

            stats = [tuple(map(int, m)) for m in STATS.findall(p.stderr)]
            self.assertEqual(len(stats), 3, p.stderr)
            self.assertEqual(stats[0][1], 0)
            # Later turns take the earlier turns' rows, all but a few at the end of the last answer
            # (tiny-f32's sliding window is 8: the 64-row log holds what its rings lost).
            self.assertGreaterEqual(stats[1][1], stats[0][0])
            self.assertGreaterEqual(stats[2][1], stats[1][0])
            self.assertIn("[image 1: 40x30, with your next message]", p.stderr)

    def test_regen_answers_the_last_message_again_with_the_next_seed(self):
        """/regen: the last answer replaced by the answer of the same conversation with the next seed,
        every prompt token from the prompt kept where its prefill ended; a new message's seed is
        the given one again."""
        flags = ["--max-tokens", "6", "--temperature", "1", "--seed", "11"]
        p = chat("tiny-f32", "/regen\nHello\n/regen\n/regen\nNext?\n", *flags)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("[no answer to regenerate]", p.stderr)
        stats = [tuple(map(int, m)) for m in STATS.findall(p.stderr)]
        self.assertEqual(len(stats), 4, p.stderr)
        self.assertEqual([s[1] for s in stats[1:3]], [stats[0][0]] * 2)  # the whole prompt reused
        answers = p.stdout.split("\n")[:4]
        self.assertNotEqual(answers[0], answers[1])
        with tempfile.TemporaryDirectory() as d:
            hello = [{"role": "user", "content": "Hello"}]
            for k, seed in enumerate(["11", "12", "13"]):
                want = run("tiny-f32", hello, [], *flags[:-1], seed, cwd=d)
                self.assertEqual(answers[k], want[:-1], f"answer {k}")
            nxt = hello + [{"role": "assistant", "content": answers[2]}, {"role": "user", "content": "Next?"}]
            self.assertEqual(answers[3], run("tiny-f32", nxt, [], *flags, cwd=d)[:-1])

    def test_commands_and_mistakes_leave_the_conversation_going(self):
        script = "/image /no/such.png\n/bogus\nHello\n/clear\nHi \\\nthere\n/exit\nnot read\n"
        p = chat("tiny-f32", script, "--max-tokens", "3")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("error: /no/such.png", p.stderr)
        self.assertIn("unknown command '/bogus'", p.stderr)
        self.assertIn("[the conversation starts over]", p.stderr)
        stats = STATS.findall(p.stderr)
        self.assertEqual(len(stats), 2, p.stderr)  # "Hello", then "Hi\nthere"; nothing after /exit
        # After /clear the turn is a conversation of its own: as a fresh chat's first turn.
        fresh = chat("tiny-f32", "Hi \\\nthere\n", "--max-tokens", "3")
        self.assertEqual(p.stdout.split("\n")[1], fresh.stdout.split("\n")[0])
        self.assertEqual(stats[1][0], STATS.findall(fresh.stderr)[0][0])
        with tempfile.TemporaryDirectory() as d:
            img = os.path.join(d, "a.png")
            with open(img, "wb") as f:
                f.write(png_bytes(1))
            p = chat("tiny-text-f32", f"/image {img}\nHello\n", "--max-tokens", "2")
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("has no vision tower", p.stderr)
            self.assertEqual(len(STATS.findall(p.stderr)), 1)


if __name__ == "__main__":
    unittest.main()
