"""The chat page (GET /) in a real browser: headless Chromium (Debian's `chromium`, driven by npm
`puppeteer-core`) loads it from `vlm serve`, asks a text question and an image question (file
picker), regenerates the image answer and edits the image question (the server takes the
conversation before each from its caches), stops a third answer mid-stream (the server counts it
cancelled), and writes a screenshot (build/chat_page.png, or $VLM_SCREENSHOT)."""
import json
import os
import subprocess
import tempfile
import unittest

from server_util import BIN, FIXTURES, Server, metric, png_bytes

JS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "js", "chat_page.mjs")
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


@unittest.skipUnless(BIN and FIXTURES, "VLM_BIN and VLM_FIXTURES must be set")
class TestChatPage(unittest.TestCase):
    def test_chat_page_in_chromium(self):
        if not os.path.exists(CHROMIUM):
            raise AssertionError(f"{CHROMIUM} is missing (scripts/setup.sh installs Debian's chromium)")
        shot = os.environ.get("VLM_SCREENSHOT") or os.path.join(os.path.dirname(BIN), "chat_page.png")
        if os.path.exists(shot):
            os.remove(shot)
        with tempfile.TemporaryDirectory() as d, Server("tiny-f32", ["--max-seqs", "2"]) as srv:
            image = os.path.join(d, "picture.png")
            with open(image, "wb") as f:
                f.write(png_bytes(7, (120, 90)))
            p = subprocess.run(["node", JS, srv.base, image, shot], capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr)
            r = json.loads(p.stdout)
            self.assertNotIn("page_error", r)
            self.assertEqual(r["external_requests"], [])
            self.assertIn("tiny-f32", r["model"])
            self.assertEqual([a["state"] for a in r["answers"]], ["done", "done", "stopped"])
            self.assertTrue(r["answers"][0]["text"] and r["answers"][1]["text"])
            self.assertEqual(r["user_images"], 1)
            # Regenerate: the same conversation again, every prompt token from the prompt kept
            # where its prefill ended; the answer replaces the last one.
            self.assertEqual(r["regenerate"]["messages"], [2, 2])
            tokens = r["regenerate"]["tokens"]
            self.assertGreater(tokens["prompt"], 0)
            self.assertEqual(tokens["cached"], tokens["prompt"])
            # Edit: the question (text and image) back in the composer, its answer gone; sent again
            # changed, the conversation before the changed text is taken, the image included.
            self.assertEqual(r["edit"]["input"], "What is in this picture?")
            self.assertEqual((r["edit"]["thumbs"], r["edit"]["messages"]), (1, [1, 1]))
            self.assertEqual((r["edit"]["after"], r["edit"]["user_images"]), ([2, 2], 1))
            tokens = r["edit"]["tokens"]
            self.assertGreater(tokens["cached"], 16)  # past the image's 16 soft tokens
            self.assertLess(tokens["cached"], tokens["prompt"])
            self.assertEqual(r["edited"]["state"], "done")
            self.assertRegex(r["stats"], r"^\d+ tokens · [\d.]+ tokens/s$")  # from the usage chunk
            self.assertIn("tokens/s", r["stats_stopped"])
            m = srv.metrics()
            self.assertGreaterEqual(metric(m, "vlm:requests_cancelled_total", 0), 1)
            self.assertGreaterEqual(metric(m, "vlm:request_success_total", 0, finished_reason="cancelled"), 1)
            self.assertEqual(srv.stop(), 0)
        with open(shot, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        self.assertGreater(os.path.getsize(shot), 5000)
        print(f"\nscreenshot: {shot}")


if __name__ == "__main__":
    unittest.main()
