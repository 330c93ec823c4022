"""The model gateway: the one way out of a trial's sandbox, run by the worker for that trial.

The agent holds a placeholder key and a base URL on its own loopback; a forwarder started in the
sandbox in front of the agent (`launcher/evalsite-forward.c`) carries those connections over a
unix socket bound into the sandbox to this gateway, which:

1. forwards only to the variant's configured endpoint of each API (`/anthropic/...` to the
   Anthropic Messages endpoint, `/openai/...` to the OpenAI Responses / Chat Completions one,
   `/gemini/...` to the Gemini API's generateContent, `/vertex/...` and `/bedrock/...` to Claude
   on Google Vertex AI and Amazon Bedrock), never elsewhere;
2. replaces whatever key the agent sent with the real one from the worker's environment, so no
   secret ever enters the sandbox;
3. reads the usage of every response, streamed (SSE) or not: input, output, cache read and
   write, reasoning tokens; prices it (`prices`); records the call (model, tokens, cost,
   latency, status, retry) as an event;
4. enforces the trial's token, cost and call budgets: once one is crossed the next request is
   refused and `stop_reason()` tells the runner to stop the agent at once;
5. answers HTTP CONNECT for the hosts a task may reach (`allowed_hosts`), refusing all others.

Plain Python (http.server in threads), no Django.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import http.client
import ipaddress
import json
import os
import queue
import select
import socket
import socketserver
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from runs_app.engine.gateway.providers import SANDBOX_PORT, SANDBOX_URL, Upstream, sandbox_variables
from runs_app.engine.usage import Usage, budget_crossed, estimate_cost, model_prices

HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
    "trailer", "transfer-encoding", "upgrade", "host", "content-length", "authorization", "x-api-key",
    "accept-encoding", "api-key", "x-goog-api-key",
}  # fmt: skip
MAX_BODY = 64 << 20
GEMINI_GENERATE, GEMINI_STREAM = ":generateContent", ":streamGenerateContent"
# The paths that ask a model for an answer (others: token counts, model lists...).
GENERATIONS = (
    "/messages", "/responses", "/chat/completions", GEMINI_GENERATE, GEMINI_STREAM,
    ":rawPredict", ":streamRawPredict", "/invoke", "/invoke-with-response-stream",
)  # fmt: skip


@dataclass
class Call:
    """One model call, as recorded."""

    api: str
    path: str
    status: int
    model: str = ""
    usage: Usage = field(default_factory=Usage)
    cost_usd: float | None = None
    latency_ms: float = 0.0
    stream: bool = False
    attempt: int = 1
    recorded: bool = False

    @property
    def is_generation(self) -> bool:
        path = self.path.split("?", 1)[0].rstrip("/")
        return path.endswith(GENERATIONS)

    def event(self) -> dict[str, Any]:
        return {
            "source": "gateway", "api": self.api, "path": self.path, "status": self.status,
            "model": self.model, "stream": self.stream, "attempt": self.attempt,
            "input_tokens": self.usage.input_tokens, "output_tokens": self.usage.output_tokens,
            "cache_read_tokens": self.usage.cache_read_tokens,
            "cache_creation_tokens": self.usage.cache_creation_tokens,
            "reasoning_tokens": self.usage.reasoning_tokens, "cost_usd": self.cost_usd,
            "latency_ms": round(self.latency_ms, 2),
        }  # fmt: skip


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = True
    gateway: Gateway


class Gateway:
    """The gateway of one trial, listening on `socket_path` (see the module docstring)."""

    def __init__(
        self,
        socket_path: Path,
        upstreams: list[Upstream],
        limits: dict[str, Any] | None = None,
        prices: dict[str, float] | None = None,
        allowed_hosts: list[str] | None = None,
    ) -> None:
        self.socket_path = Path(socket_path)
        self.upstreams = {upstream.api: upstream for upstream in upstreams}
        self.limits = dict(limits or {})
        self.prices = prices
        self.allowed_hosts = {host.lower() for host in allowed_hosts or []}
        self.usage = Usage()
        self.cost_usd = 0.0
        self.unpriced: set[str] = set()
        self.calls = 0
        self.crossed: str | None = None
        self.events: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._in_flight = 0
        self._bodies: dict[str, int] = {}
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # --- life cycle ----------------------------------------------------------------------------

    def start(self) -> Gateway:
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        self._server = _Server(str(self.socket_path), _Handler)
        self._server.gateway = self
        # A long poll: a hundredth of a second made 256 idle gateways cost a worker a core in
        # wakeups. close() wakes the loop itself.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 5.0}, name="gateway", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        if self._server is not None:
            # serve_forever sees the shutdown request when its select returns: a connection
            # makes it return now, not at the next poll.
            stopper = threading.Thread(target=self._server.shutdown, name="gateway-stop", daemon=True)
            stopper.start()
            while stopper.is_alive():
                self._wake()
                stopper.join(0.05)
            self._server.server_close()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def _wake(self) -> None:
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as poke:
            poke.connect(str(self.socket_path))

    def settle(self, timeout: float = 5.0) -> None:
        """Wait for the calls still being forwarded (an agent may exit as soon as it has read its
        last answer, before the gateway has counted it)."""
        with self._idle:
            self._idle.wait_for(lambda: self._in_flight == 0, timeout)

    def _enter(self) -> None:
        with self._lock:
            self._in_flight += 1

    def _leave(self) -> None:
        with self._idle:
            self._in_flight -= 1
            self._idle.notify_all()

    def stop_reason(self) -> str | None:
        """The budget crossed (the runner stops the agent), else None."""
        return self.crossed

    def drain(self) -> list[dict[str, Any]]:
        out = []
        while True:
            try:
                out.append(self.events.get_nowait())
            except queue.Empty:
                return out

    def sandbox_env(self) -> dict[str, str]:
        """What the agent is given instead of keys: placeholders and the gateway's URLs."""
        env: dict[str, str] = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
        env.update(sandbox_variables(self.upstreams.values()))
        if self.allowed_hosts:
            env.update(HTTPS_PROXY=SANDBOX_URL, HTTP_PROXY=SANDBOX_URL, https_proxy=SANDBOX_URL,
                       http_proxy=SANDBOX_URL)  # fmt: skip
        return env

    # --- accounting -----------------------------------------------------------------------------

    def refusal(self) -> str | None:
        """Why the next request is refused: a budget already crossed, or the calls used up."""
        with self._lock:
            if self.crossed:
                return self.crossed
            max_turns = self.limits.get("max_turns")
            if max_turns is not None and self.calls >= max_turns:
                self.crossed = "max_turns"
                return self.crossed
            return None

    def attempt_of(self, body: bytes) -> int:
        digest = hashlib.sha256(body).hexdigest()
        with self._lock:
            self._bodies[digest] = self._bodies.get(digest, 0) + 1
            return self._bodies[digest]

    def record(self, call: Call) -> None:
        prices = model_prices(call.model, self.prices)
        if prices is not None:
            call.cost_usd = estimate_cost(call.usage, prices)
        with self._lock:
            # Turns count generations; token counts, model lists and the like are not turns.
            self.calls += call.is_generation
            for name in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_creation_tokens",
                         "reasoning_tokens"):  # fmt: skip
                setattr(self.usage, name, getattr(self.usage, name) + getattr(call.usage, name))
            self.usage.turns = self.calls
            if call.cost_usd is not None:
                self.cost_usd += call.cost_usd
            elif call.model:
                self.unpriced.add(call.model)
            self.usage.cost_usd = self.cost_usd
            limits = {k: v for k, v in self.limits.items() if k != "max_turns"}  # turns: refusal()
            if self.crossed is None:
                self.crossed = budget_crossed(self.usage, limits)
        self.events.put(call.event())

    def totals(self) -> Usage:
        with self._lock:
            return Usage(**{**self.usage.__dict__})


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    @property
    def gateway(self) -> Gateway:
        return self.server.gateway

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
        pass  # calls are recorded as trial events, not on the worker's stderr

    def address_string(self) -> str:
        return "sandbox"

    def do_CONNECT(self) -> None:  # noqa: N802 - http.server's name
        host, _, port = self.path.rpartition(":")
        if host.lower() not in self.gateway.allowed_hosts or not port.isdigit():
            self._error(403, f"egress to {self.path} is not allowed for this task")
            return
        try:
            address = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)[0][4]
        except OSError as exc:
            self._error(502, f"cannot resolve {host}: {exc}")
            return
        ip = ipaddress.ip_address(address[0])
        if ip.is_loopback or ip.is_private or ip.is_link_local or ip.is_unspecified:
            # A public name that resolves to the worker or its network (DNS rebinding) is refused.
            self._error(403, f"{host} resolves to {ip}, a private address: egress refused")
            return
        try:
            upstream = socket.create_connection((str(address[0]), int(address[1])), timeout=30)
        except OSError as exc:
            self._error(502, f"cannot reach {self.path}: {exc}")
            return
        self.send_response(200, "Connection established")
        self.end_headers()
        _pipe(self.connection, upstream)
        self.close_connection = True

    def do_GET(self) -> None:  # noqa: N802
        self._proxy()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_GET

    def _proxy(self) -> None:
        self.gateway._enter()
        try:
            self._proxy_call()
        finally:
            self.gateway._leave()

    def _proxy_call(self) -> None:
        api, _, rest = self.path.lstrip("/").partition("/")
        upstream = self.gateway.upstreams.get(api)
        if upstream is None:
            self._error(404, f"the gateway forwards only to {', '.join(self.gateway.upstreams) or 'nothing'}")
            return
        body = self._body()
        if body is None:
            return
        refused = self.gateway.refusal()
        if refused:
            self.gateway.events.put({"source": "gateway", "api": api, "refused": refused, "path": "/" + rest})
            self._error(429, f"evalsite: the trial's {refused} budget is used up; the agent is being stopped")
            return
        call = Call(api, "/" + rest, 0, attempt=self.gateway.attempt_of(body))
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            request = json.loads(body) if body else {}
            call.model = str(request.get("model") or "") if isinstance(request, dict) else ""
            call.stream = bool(isinstance(request, dict) and request.get("stream"))
        if api in ("gemini", "vertex"):  # the model is in the path: models/M:streamGenerateContent
            call.model = call.model or _gemini_model(rest)
            call.stream = call.stream or "stream" in rest.split("?", 1)[0].rpartition(":")[2].lower()
        elif api == "bedrock":  # model/M/invoke-with-response-stream
            _, _, tail = rest.split("?", 1)[0].partition("model/")
            call.model = call.model or tail.split("/", 1)[0]
            call.stream = rest.split("?", 1)[0].endswith("-with-response-stream")
        started = time.perf_counter()
        try:
            self._forward(upstream, rest, body, call, started)
        finally:
            if not call.recorded:
                self.gateway.record(call)

    def _body(self) -> bytes | None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._error(413, "request too large")
            return None
        return self.rfile.read(length) if length else b""

    def _forward(self, upstream: Upstream, rest: str, body: bytes, call: Call, started: float) -> None:
        target = urlsplit(upstream.base_url)
        base_path = target.path.rstrip("/")
        if upstream.api == "openai" and base_path.endswith("/v1") and rest.startswith("v1/"):
            rest = rest[3:]  # the agent was given .../openai/v1: do not double the /v1
        if upstream.api == "gemini":
            rest = _without_query_key(rest)  # the key goes in a header, the agent's placeholder nowhere
        path = f"{base_path}/{rest}"
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        headers.update(upstream.auth_headers())
        headers["Accept-Encoding"] = "identity"  # usage is read from the body
        connection_class = (
            http.client.HTTPSConnection if target.scheme == "https" else http.client.HTTPConnection
        )
        # run_limits.turn_timeout: a model call that stays silent this long is abandoned.
        timeout = float(self.gateway.limits.get("turn_timeout") or 600)
        conn = connection_class(target.hostname or "", target.port, timeout=timeout)
        try:
            conn.request(self.command, path, body=body or None, headers=headers)
            response = conn.getresponse()
        except OSError as exc:
            call.status = 502
            call.latency_ms = (time.perf_counter() - started) * 1000
            self._error(502, f"the model server at {upstream.base_url} cannot be reached: {exc}")
            return
        call.status = response.status
        reader = _UsageReader(upstream.api, call)
        streaming = response.getheader("Content-Length") is None
        self.send_response(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() not in HOP_BY_HOP:
                self.send_header(name, value)
        # The call is recorded before the agent gets the response's last bytes: an agent that exits
        # the moment it has its answer must not leave a call uncounted.
        if streaming:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while chunk := response.read1(65536):
                reader.feed(chunk)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self._record(reader, call, started)
            self.wfile.write(b"0\r\n\r\n")
        else:
            data = response.read()
            reader.feed(data)
            self._record(reader, call, started)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        self.wfile.flush()
        conn.close()

    def _record(self, reader: _UsageReader, call: Call, started: float) -> None:
        reader.finish()
        call.latency_ms = (time.perf_counter() - started) * 1000
        self.gateway.record(call)
        call.recorded = True

    def _error(self, status: int, message: str) -> None:
        body = json.dumps(
            {"type": "error", "error": {"type": "evalsite_gateway", "message": message}}
        ).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _UsageReader:
    """Reads a response's usage and model, whether JSON or Server-Sent Events."""

    def __init__(self, api: str, call: Call) -> None:
        self.api, self.call = api, call
        self.buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) > MAX_BODY:  # never hold more than one large response
            del self.buffer[: len(self.buffer) - MAX_BODY]

    def finish(self) -> None:
        if self.api == "bedrock" and self.buffer[:1] != b"{":
            for payload in _eventstream_payloads(bytes(self.buffer)):
                with contextlib.suppress(ValueError, TypeError, binascii.Error):
                    self._read(json.loads(base64.b64decode(json.loads(payload)["bytes"])))
            return
        text = self.buffer.decode("utf-8", "replace")
        stripped = text.lstrip()
        if stripped.startswith("{"):
            with contextlib.suppress(ValueError):
                self._read(json.loads(stripped))
            return
        for line in text.splitlines():
            if line.startswith("data:"):
                with contextlib.suppress(ValueError):
                    self._read(json.loads(line[5:].strip()))

    def _read(self, obj: Any) -> None:
        if not isinstance(obj, dict):
            return
        kind = obj.get("type")
        if kind == "message_start":
            self._anthropic(obj.get("message") or {})
        elif kind == "message_delta":
            usage = obj.get("usage") or {}
            self.call.usage.output_tokens = max(
                self.call.usage.output_tokens, _int(usage.get("output_tokens"))
            )
            if usage.get("input_tokens") is not None:  # newer APIs repeat the totals here
                self._anthropic({"usage": usage})
        elif kind == "message" and "usage" in obj:
            self._anthropic(obj)
        elif isinstance(kind, str) and kind.startswith("response.") and isinstance(obj.get("response"), dict):
            self._responses(obj["response"])
        elif obj.get("object") == "response":
            self._responses(obj)
        elif obj.get("object") in ("chat.completion", "chat.completion.chunk") and obj.get("usage"):
            self._chat(obj)
        elif isinstance(obj.get("usageMetadata"), dict):
            self._gemini(obj)

    def _anthropic(self, message: dict) -> None:
        usage = message.get("usage") or {}
        if message.get("model"):
            self.call.model = str(message["model"])
        self.call.usage.input_tokens = _int(usage.get("input_tokens"))
        self.call.usage.cache_read_tokens = _int(usage.get("cache_read_input_tokens"))
        self.call.usage.cache_creation_tokens = _int(usage.get("cache_creation_input_tokens"))
        self.call.usage.output_tokens = max(self.call.usage.output_tokens, _int(usage.get("output_tokens")))

    def _responses(self, response: dict) -> None:
        usage = response.get("usage")
        if response.get("model"):
            self.call.model = str(response["model"])
        if not isinstance(usage, dict):
            return
        cached = _int((usage.get("input_tokens_details") or {}).get("cached_tokens"))
        self.call.usage.input_tokens = max(0, _int(usage.get("input_tokens")) - cached)
        self.call.usage.cache_read_tokens = cached
        self.call.usage.output_tokens = _int(usage.get("output_tokens"))
        self.call.usage.reasoning_tokens = _int(
            (usage.get("output_tokens_details") or {}).get("reasoning_tokens")
        )

    def _chat(self, obj: dict) -> None:
        usage = obj["usage"]
        if obj.get("model"):
            self.call.model = str(obj["model"])
        cached = _int((usage.get("prompt_tokens_details") or {}).get("cached_tokens"))
        self.call.usage.input_tokens = max(0, _int(usage.get("prompt_tokens")) - cached)
        self.call.usage.cache_read_tokens = cached
        self.call.usage.output_tokens = _int(usage.get("completion_tokens"))
        details = usage.get("completion_tokens_details") or {}
        self.call.usage.reasoning_tokens = _int(details.get("reasoning_tokens"))

    def _gemini(self, obj: dict) -> None:
        """Gemini repeats the running totals on each streamed chunk: the last one counts. Its
        prompt count includes cached tokens; thinking tokens are billed as output."""
        usage = obj["usageMetadata"]
        if obj.get("modelVersion"):
            self.call.model = str(obj["modelVersion"])
        cached = _int(usage.get("cachedContentTokenCount"))
        self.call.usage.input_tokens = max(0, _int(usage.get("promptTokenCount")) - cached)
        self.call.usage.cache_read_tokens = cached
        thoughts = _int(usage.get("thoughtsTokenCount"))
        self.call.usage.output_tokens = _int(usage.get("candidatesTokenCount")) + thoughts
        self.call.usage.reasoning_tokens = thoughts


def _eventstream_payloads(data: bytes) -> list[bytes]:
    """The payloads of an AWS event stream (Bedrock's streamed answers): frames of total length,
    headers length and a prelude CRC (4 bytes each), the headers, the payload, a message CRC."""
    payloads, offset = [], 0
    while offset + 16 <= len(data):
        total, headers = struct.unpack_from(">II", data, offset)
        if total < 16 or offset + total > len(data):
            break
        payloads.append(data[offset + 12 + headers : offset + total - 4])
        offset += total
    return payloads


def _gemini_model(rest: str) -> str:
    path = rest.split("?", 1)[0]
    _, _, tail = path.rpartition("models/")
    return tail.split(":", 1)[0] if tail else ""


def _without_query_key(rest: str) -> str:
    path, _, query = rest.partition("?")
    kept = [part for part in query.split("&") if part and not part.startswith("key=")]
    return path + ("?" + "&".join(kept) if kept else "")


def _int(value: Any) -> int:
    if isinstance(value, bool):
        return 0
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return 0


def _pipe(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until either side closes (CONNECT tunnels)."""
    sockets = [a, b]
    try:
        while True:
            readable, _, _ = select.select(sockets, [], [], 300)
            if not readable:
                return
            for source in readable:
                data = source.recv(65536)
                if not data:
                    return
                (b if source is a else a).sendall(data)
    finally:
        b.close()


def wrap_command(argv: list[str], socket_path: Path, forwarder: Path) -> list[str]:
    """`argv` started behind the forwarder (`forwarder.c`: it listens on the gateway's port
    on the sandbox's loopback and carries each connection to the gateway's unix socket)."""
    return [str(forwarder), str(SANDBOX_PORT), str(socket_path), "--", *argv]


def socket_path_for(root: Path) -> Path:
    """The gateway's socket for a trial folder (unix socket paths are limited to 107 bytes)."""
    path = root / "gateway.sock"
    if len(os.fsencode(path)) > 100:
        raise ValueError(f"the trial folder {root} is too deep for a unix socket: shorten TRIAL_ROOT")
    return path
