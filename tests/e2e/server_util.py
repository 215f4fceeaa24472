"""Helpers for the `vlm serve` / `vlm batch` tests: start the real server on 127.0.0.1 with an
ephemeral port, raw HTTP, server-sent events, the official `openai` npm client, test images."""
import base64
import http.client
import io
import json
import os
import re
import signal
import socket
import subprocess
import time
import unittest

BIN = os.environ.get("VLM_BIN")
FIXTURES = os.environ.get("VLM_FIXTURES")
SRC = os.environ.get("VLM_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
JS_CLIENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "js", "openai_client.mjs")


def sanitized():
    """True for a VLM_SANITIZE or VLM_TSAN build (the binary links ASan's or TSan's runtime)."""
    with open(BIN, "rb") as f:
        data = f.read()
    return b"__asan_init" in data or b"__tsan_init" in data


def model_dir(name):
    return os.path.join(FIXTURES, name)


def windowed_copy(tmp, window=64):
    """A copy of tiny-f32 in `tmp` (its files linked) with a sliding window of `window` instead of 8,
    so that the sliding layers' rings hold a whole short prompt or chat turn: a running or finished
    sequence's rows can then be taken by another."""
    folder = os.path.join(tmp, "tiny-f32")
    os.mkdir(folder)
    for f in os.listdir(model_dir("tiny-f32")):
        if f != "config.json":
            os.symlink(os.path.join(model_dir("tiny-f32"), f), os.path.join(folder, f))
    with open(os.path.join(model_dir("tiny-f32"), "config.json")) as f:
        cfg = json.load(f)
    cfg["text_config"]["sliding_window"] = window
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    return folder


class Server:
    """`vlm serve` on 127.0.0.1:<any free port>; stop() sends SIGTERM and returns the exit code."""

    def __init__(self, model="tiny-f32", args=(), wait_ready=True, threads=1):
        self.proc = subprocess.Popen([BIN, "serve", "--model", model_dir(model), "--port", "0",
                                      "--threads", str(threads), *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.stderr_lines = []
        line = self.proc.stderr.readline()
        self.stderr_lines.append(line)
        m = re.search(r"listening on http://([\d.]+):(\d+)", line)
        if not m:
            self.proc.kill()
            raise AssertionError(f"vlm serve did not report its port: {line!r} {self.proc.stderr.read()}")
        self.host, self.port = m.group(1), int(m.group(2))
        self.health_seen = []
        if wait_ready:
            self.wait_ready()

    @property
    def base(self):
        return f"http://{self.host}:{self.port}"

    def wait_ready(self, timeout=120):
        end = time.time() + timeout
        while time.time() < end:
            try:
                status, _, body = self.request("GET", "/health")
                self.health_seen.append((status, body))
                if status == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise AssertionError(f"vlm serve exited {self.proc.returncode}: {self.proc.stderr.read()}")
            time.sleep(0.02)
        raise AssertionError("vlm serve did not become ready")

    def request(self, method, path, body=None, headers=None, timeout=120):
        """Returns (status, headers dict, body bytes)."""
        c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body).encode()
            h = {"Content-Type": "application/json"} if body is not None else {}
            h.update(headers or {})
            c.request(method, path, body=body, headers=h)
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            c.close()

    def post(self, path, body, headers=None):
        status, h, raw = self.request("POST", path, body, headers)
        return status, h, json.loads(raw) if raw else None

    def events(self, path, body, headers=None):
        """POSTs a streaming request; returns (status, list of the raw `data:` payloads)."""
        status, h, raw = self.request("POST", path, body, headers)
        if status != 200:
            return status, json.loads(raw)
        self_check_sse(h, raw)
        return status, [block[len("data: "):] for block in raw.decode().split("\n\n") if block]

    def metrics(self):
        status, _, raw = self.request("GET", "/metrics")
        assert status == 200
        out = {}
        for line in raw.decode().splitlines():
            if line.startswith("#") or not line:
                continue
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
        return out

    def status_kb(self, field):
        """A kB figure of the server's /proc/PID/status: VmRSS, VmLck, ..."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        raise AssertionError(f"no {field}")

    def stop(self, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("vlm serve did not exit after SIGTERM")
        self.stderr_lines.append(self.proc.stderr.read())
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class SharedServer(unittest.TestCase):
    """One `vlm serve` of tiny-f32 on 2 threads for all of a class's tests, as `self.srv`, started
    with the class's SERVER_ARGS."""
    SERVER_ARGS = ("--max-seqs", "4")

    @classmethod
    def setUpClass(cls):
        cls.srv = Server("tiny-f32", list(cls.SERVER_ARGS), threads=2)

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()

    def post_ok(self, path, body):
        """The JSON answer of a POST, which must be a 200."""
        code, _, r = self.srv.post(path, body)
        self.assertEqual(code, 200, r)
        return r


def self_check_sse(headers, raw):
    assert headers.get("content-type") == "text/event-stream", headers
    text = raw.decode()
    assert text.endswith("data: [DONE]\n\n"), text[-200:]
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data: ") and "\n" not in block, repr(block)


def metric(m, name, default=None, **labels):
    """The sum of the series of Server.metrics() named `name` whose labels include `labels`;
    `default` when there is none (None: fail)."""
    total = 0.0
    found = False
    for key, v in m.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', rest))
        if all(got.get(k) == str(val) for k, val in labels.items()):
            total += v
            found = True
    if not found:
        if default is not None:
            return default
        raise AssertionError(f"no series {name} {labels} in /metrics")
    return total


def openai_client(server, jobs, concurrent=False, api_key="none", timeout=600):
    """Runs jobs through the official `openai` npm client (js/openai_client.mjs)."""
    p = subprocess.run(["node", JS_CLIENT, server.base + "/v1", api_key],
                       input=json.dumps({"concurrent": concurrent, "jobs": jobs}),
                       capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError(f"openai_client.mjs failed: {p.stderr}")
    return json.loads(p.stdout)


def png_bytes(seed, size=(40, 30)):
    """A small deterministic RGB PNG (PIL)."""
    from PIL import Image
    w, h = size
    img = Image.new("RGB", (w, h))
    img.putdata([((x * 7 + seed * 31) % 256, (y * 11 + seed * 17) % 256, (x * y + seed) % 256)
                 for y in range(h) for x in range(w)])
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def data_uri(seed, size=(40, 30)):
    return "data:image/png;base64," + base64.b64encode(png_bytes(seed, size)).decode()


def chat(text, image_seeds=(), max_tokens=12, **extra):
    """A greedy chat request body with images first, then the text."""
    content = [{"type": "image_url", "image_url": {"url": data_uri(s)}} for s in image_seeds]
    content.append({"type": "text", "text": text})
    body = {"model": "tiny-f32", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, "return_token_ids": True}
    body.update(extra)
    return body


def raw_exchange(host, port, payload, timeout=5.0):
    """Sends raw bytes on a fresh connection; returns the response (headers and Content-Length
    body), or what came before the server closed or the timeout passed (b"" if nothing).
    The client never half-closes: cpp-httplib takes a half-closed socket for a client gone."""
    s = socket.create_connection((host, port), timeout=timeout)
    try:
        try:
            s.sendall(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass
        out = b""
        while True:
            head, sep, body = out.partition(b"\r\n\r\n")
            if sep:
                m = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
                if m and len(body) >= int(m.group(1)):
                    return out
            try:
                chunk = s.recv(65536)
            except (socket.timeout, ConnectionResetError):
                return out
            if not chunk:
                return out
            out += chunk
    finally:
        s.close()
