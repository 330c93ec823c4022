"""What isolation costs: starting a command in the namespace sandbox, and one model call through
the gateway.

1. Sandbox start: `run_process(["true"])` inside bubblewrap (namespaces, mounts, cgroups, the
   leased uid on a root worker) against a bare fork+exec of `true`, N times each.
2. Gateway latency: N small JSON model calls (with usage) to a local upstream server, straight
   and through the trial gateway (unix socket, key injection, usage reading, pricing); the
   difference is what the gateway adds per request.

Usage: .venv/bin/python bench/sandbox_gateway.py [N]        (default 200)
Targets on this machine: sandbox start under 10 ms, gateway under 1 ms per request.
"""

import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runs_app.engine import sandbox  # noqa: E402 (after the path)
from runs_app.engine.gateway import Gateway, Upstream  # noqa: E402
from runs_app.engine.sandbox import bubblewrap  # noqa: E402
from runs_app.engine.sandbox.workspace import cleanup, layout  # noqa: E402

BODY = json.dumps(
    {"type": "message", "model": "claude-sonnet-4-6", "usage": {"input_tokens": 100, "output_tokens": 20}}
).encode()


class Upstream200(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str):
        super().__init__("localhost")
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def stats(samples: list[float]) -> str:
    samples = sorted(samples)
    return f"median {statistics.median(samples):.2f} ms, p95 {samples[int(0.95 * (len(samples) - 1))]:.2f} ms"


def timed(call, n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        call()
        out.append((time.perf_counter() - started) * 1000)
    return out


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    base = Path(tempfile.mkdtemp(prefix="evalsite-bench-", dir="/var/tmp"))
    os.chmod(base, 0o711)
    paths = layout(base / "trial")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(paths.home)}
    limits = sandbox.Limits(wall_seconds=10)
    box = {"mounts": [sandbox.Mount(paths.home, writable=True)], "tmp": paths.tmp}
    bubblewrap.run_process(
        ["true"], cwd=paths.workspace, env=env, limits=limits, **box
    )  # stage runtimes once
    bare = timed(lambda: subprocess.run(["true"], check=True), n)
    boxed = timed(
        lambda: bubblewrap.run_process(["true"], cwd=paths.workspace, env=env, limits=limits, **box), n
    )
    uid = "the leased sandbox uid" if os.geteuid() == 0 else "the worker's own uid"
    print(f"sandbox start ({uid}), run_process(['true']) x{n}: {stats(boxed)}")
    print(f"bare fork+exec of true x{n}: {stats(bare)}")
    print(f"added by the sandbox: median {statistics.median(boxed) - statistics.median(bare):.2f} ms")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Upstream200)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    gateway = Gateway(paths.root / "bench.sock", [Upstream("anthropic", url, "sk-bench")]).start()
    request = json.dumps({"model": "claude-sonnet-4-6", "messages": []}).encode()
    headers = {"Content-Type": "application/json"}
    gateway_conn = UnixHTTPConnection(str(gateway.socket_path))

    def direct():
        # A new connection per call, as the gateway opens upstream (a kept-alive one would meet
        # Nagle + delayed ACK: http.server writes headers and body apart).
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1])
        conn.request("POST", "/v1/messages", body=request, headers=headers)
        conn.getresponse().read()
        conn.close()

    def through():
        gateway_conn.request("POST", "/anthropic/v1/messages", body=request, headers=headers)
        gateway_conn.getresponse().read()

    timed(direct, 20), timed(through, 20)  # warm up
    straight = timed(direct, n)
    proxied = timed(through, n)
    print(f"model call straight to the upstream x{n}: {stats(straight)}")
    print(f"model call through the gateway x{n}: {stats(proxied)} ({gateway.calls} calls counted)")
    print(f"added by the gateway: median {statistics.median(proxied) - statistics.median(straight):.2f} ms")
    gateway.close()
    server.shutdown()
    cleanup(paths.root)
    os.rmdir(base)


if __name__ == "__main__":
    main()
