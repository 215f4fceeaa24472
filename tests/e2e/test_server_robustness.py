"""`vlm serve` under 1,000 malformed or hostile requests (random bytes, huge headers, truncated and
chunked bodies, invalid base64, deep JSON, wrong types): every answered request gets a 4xx, never a
5xx; afterwards a valid request succeeds and the resident memory has not grown with the count."""
import json
import random
import socket
import unittest

from server_util import BIN, FIXTURES, Server, chat, data_uri, raw_exchange, sanitized


def post(body, extra_headers=b""):
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n" + extra_headers +
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def hostile(rng, i):
    """The i-th hostile request: (raw bytes, whether it is a complete HTTP request)."""
    kind = i % 12
    good = chat("hi", max_tokens=1)
    if kind == 0:
        return bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 2000))), False
    if kind == 1:  # huge header
        return b"GET /health HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * rng.randint(9000, 70000) + b"\r\n\r\n", False
    if kind == 2:  # truncated body: the length promises more than comes
        b = json.dumps(good).encode()
        return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: " + str(len(b) + 50).encode() +
                b"\r\n\r\n" + b[: rng.randint(0, len(b))]), False
    if kind == 3:  # chunked body
        return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"10\r\n" + b"x" * 16 + b"\r\n0\r\n\r\n"), True
    if kind == 4:  # invalid base64 / not an image
        url = rng.choice(["data:image/png;base64,!!!!", "data:image/png;base64," + "A" * rng.randint(1, 99),
                          "data:image/png,abc", data_uri(i)[:rng.randint(30, 300)], "data:;base64,"])
        return post({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]}), True
    if kind == 5:  # deep JSON
        d = rng.randint(100, 50000)
        return post(b"[" * d + b"]" * d), True
    if kind == 6:  # a wrong type in one field
        k, v = rng.choice([("messages", rng.choice([1, "x", {}, True])), ("temperature", rng.choice(["x", [], {}, True])),
                           ("max_tokens", rng.choice(["9", 1.5, [], True, -1])), ("stream", rng.choice([1, "yes", []])),
                           ("stop", rng.choice([1, {}, [1], [None]])), ("seed", rng.choice(["1", 1.5, []])),
                           ("top_p", rng.choice(["x", 7, {}])), ("model", rng.choice([1, [], {}])),
                           ("logprobs", rng.choice([1, "x"])), ("stream_options", rng.choice([1, "x", []])),
                           ("n", rng.choice([2, "1", 0])), ("response_format", rng.choice(["json", 1, {"type": 5}]))])
        return post(dict(good, **{k: v})), True
    if kind == 7:  # random bytes as the body
        return post(bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 500)))), True
    if kind == 8:  # invalid UTF-8 and NULs in strings
        return post(b'{"messages":[{"role":"user","content":"\xff\xfe\x00' + bytes([rng.randint(128, 255)]) + b'"}]}'), True
    if kind == 9:  # a bad request line / method
        return rng.choice([b"BREW /coffee HTCPCP/1.0\r\n\r\n", b"GET\r\n\r\n", b"\r\n\r\n",
                           b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n"]), False
    if kind == 10:  # bad Content-Length values
        cl = rng.choice([b"-1", b"abc", b"99999999999999999999", b"1e3", b""])
        return b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: " + cl + b"\r\n\r\n{}", False
    # duplicate keys, huge numbers, messages of junk
    return post(rng.choice([b'{"messages":[],"messages":[]}', b'{"max_tokens": 1e999}',
                            json.dumps({"messages": [rng.random()] * 50}).encode(),
                            json.dumps({"prompt": 5}).encode()])), True


@unittest.skipUnless(BIN and FIXTURES, "VLM_BIN and VLM_FIXTURES must be set")
class TestHostile(unittest.TestCase):
    def test_1000_hostile_requests(self):
        rng = random.Random(1234)
        with Server("tiny-f32") as srv:
            def run(first, last):
                statuses = {}
                for i in range(first, last):
                    payload, complete = hostile(rng, i)
                    try:
                        # An incomplete request waits for bytes that never come: the server keeps
                        # reading until the client leaves, which it does after a short wait.
                        out = raw_exchange(srv.host, srv.port, payload, timeout=30 if complete else 0.15)
                    except (ConnectionResetError, BrokenPipeError, socket.timeout):
                        out = b""
                    status = int(out[9:12]) if out.startswith(b"HTTP/1.1 ") else 0
                    statuses[status] = statuses.get(status, 0) + 1
                    self.assertFalse(500 <= status < 600, f"request {i} (kind {i % 12}) got {out[:300]!r}")
                    if complete and status:
                        self.assertTrue(400 <= status < 500, f"request {i}: {out[:300]!r}")
                    self.assertIsNone(srv.proc.poll(), f"the server died on request {i}")
                return statuses

            run(0, 200)  # warm-up: pools, allocator arenas
            rss0 = srv.status_kb("VmRSS")
            statuses = run(200, 1000)
            rss1 = srv.status_kb("VmRSS")
            code, _, r = srv.post("/v1/chat/completions", chat("Still there?", image_seeds=[1], max_tokens=3))
            self.assertEqual(code, 200, r)
            print(f"\nhostile requests by status: {dict(sorted(statuses.items()))}; "
                  f"RSS {rss0} kB after 200, {rss1} kB after 1000 ({rss1 - rss0:+d} kB)")
            # ASan keeps freed blocks in its quarantine (LeakSanitizer checks at exit), TSan their
            # access history.
            if not sanitized():
                self.assertLess(rss1 - rss0, 16 * 1024, "RSS grows with the request count")
            self.assertEqual(srv.stop(), 0)


if __name__ == "__main__":
    unittest.main()
