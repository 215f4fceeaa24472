"""What the server benchmarks share: starting a server and waiting until it serves, and a test
image as a data URI."""
import base64
import contextlib
import http.client
import io
import re
import subprocess
import threading
import time

VLM_READY = r"listening on http://[\d.]+:(\d+)"


@contextlib.contextmanager
def serving(cmd, ready=VLM_READY):
    """Runs a server (`vlm serve` or llama-server) whose stderr names its port in `ready`'s group;
    gives its port once GET /health answers 200 (both do once the model is loaded), and stops it
    (SIGTERM) at the end of the block."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    port = None
    for line in p.stderr:
        m = re.search(ready, line)
        if m:
            port = int(m.group(1))
            break
    if port is None:
        raise SystemExit(f"{cmd[0]} did not start")
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()  # a full pipe would stall it
    try:
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        yield port
    finally:
        p.terminate()
        p.wait(120)


def png_data_uri(w, h):
    """A deterministic RGB PNG of w x h pixels as a data: URI."""
    from PIL import Image
    img = Image.new("RGB", (w, h))
    img.putdata([((x * 3) % 256, (y * 5) % 256, (x * y) % 256) for y in range(h) for x in range(w)])
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
