"""Outages for tests and benches, on loopback only: a service (PostgreSQL, Redis) reached through a
TCP proxy the test cuts and restores, so that the machine's own service, which other work uses,
is never stopped. A cut resets every connection through the proxy and refuses new ones, as a
stopped or restarting server does; the test process itself keeps its direct connection."""

import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from conftest import BASE_DIR
from tests.hosts import Relay


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class CutProxy:
    """127.0.0.1:`port` forwarded to 127.0.0.1:`target_port` until `cut()`, again after `restore()`."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.relay = Relay()
        self.relay.forward("127.0.0.1", self.port, target_port)

    def url(self, url: str) -> str:
        """`url` (a postgres:// or redis:// URL of the target) through the proxy."""
        parts = urlsplit(url)
        netloc = parts.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))

    def cut(self) -> None:
        self.relay.drop()

    def restore(self) -> None:
        self.relay.forward("127.0.0.1", self.port, self.target_port)

    def stop(self) -> None:
        self.relay.stop()


class WebProcess:
    """`uvicorn evalsite.asgi:application` (the production web server) in its own process."""

    def __init__(self, log_dir: Path, env: dict[str, str], workers: int = 1) -> None:
        self.port = free_port()
        self.log_path = log_dir / f"web-{self.port}.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "evalsite.asgi:application", "--port", str(self.port),
             "--workers", str(workers), "--log-level", "warning", "--no-access-log"],
            cwd=BASE_DIR, env=env, stdout=self.log_path.open("w"), stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the web process did not start:\n{self.log()}") from None
                time.sleep(0.2)

    def get(self, path: str, cookie: str, timeout: float = 30) -> tuple[int, dict[str, str], str]:
        """(status, headers with lower-case names, body) of a GET of `path` with `cookie`."""
        import http.client

        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            connection.request("GET", path, headers={"Cookie": cookie})
            response = connection.getresponse()
            body = response.read().decode(errors="replace")
            return response.status, {k.lower(): v for k, v in response.getheaders()}, body
        finally:
            connection.close()

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def stop(self) -> None:
        import os
        import signal

        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=15)
