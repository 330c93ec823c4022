"""The model gateway: the one way out of a trial's sandbox, run by the worker for that trial.

The agent holds a placeholder key and a base URL on its own loopback; a forwarder started in the
sandbox in front of the agent (`forwarder.c`) carries those connections over a unix socket bound
into the sandbox to this gateway, which:

1. forwards only each API's own paths (`API_PATHS`: `/anthropic/v1/messages` to the Anthropic
   Messages endpoint, `/openai/v1/responses` to the OpenAI Responses one, `/gemini/...` to the
   Gemini API's generateContent, `/vertex/...` and `/bedrock/...` to Claude on Google Vertex AI
   and Amazon Bedrock...) to the variant's configured endpoint of that API, never elsewhere;
2. replaces whatever key the agent sent with the real one from the worker's environment, so no
   secret ever enters the sandbox, and passes on only the request headers the APIs need
   (`FORWARDED_HEADERS`): nothing the agent says about hosts, addresses, cookies or accounts;
3. reads the usage of every response, streamed (SSE) or not: input, output, cache read and
   write, reasoning tokens; prices it (`prices`); records the call (model, tokens, cost,
   latency, status, retry) as an event;
4. enforces the trial's token, cost and call budgets: a model call takes its turn before it is
   forwarded (so calls made at once cannot overrun `max_turns`), usage counts as it arrives (a
   streamed answer's as it comes), and once a budget is crossed no request goes out and
   `stop_reason()` tells the runner to stop the agent at once;
5. answers HTTP CONNECT for the hosts a task may reach (`allowed_hosts`), refusing all others.

The agent may also reach the socket without the forwarder, so the gateway holds on its own
against a hostile one: at most `MAX_CONNECTIONS` connections at once (one thread each; more are
answered 503 at once), every read bounded in time (`IDLE_SECONDS`, `REQUEST_SECONDS`) and size
(`MAX_HEAD`, `MAX_BODY`, `MAX_HELD` for all of a trial's bodies at once), and nothing forwarded
before the whole request has arrived: one trial cannot starve the worker or its neighbours.

Plain Python (http.server in threads), no Django.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import http.client
import io
import ipaddress
import json
import math
import os
import queue
import re
import select
import socket
import socketserver
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from runs_app.engine.gateway.providers import SANDBOX_PORT, SANDBOX_URL, Upstream, sandbox_variables
from runs_app.engine.usage import Usage, budget_crossed, estimate_cost, model_prices, summed

# Response headers that belong to one connection, or that the gateway sets itself.
HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
    "trailer", "transfer-encoding", "upgrade", "content-length",
}  # fmt: skip
# The only request headers passed upstream: what the real CLIs send that the APIs read (seen
# from Claude Code, Codex, the Gemini CLI, opencode and Aider). Keys, hosts, X-Forwarded-*,
# cookies, billing accounts (OpenAI-Organization, x-goog-user-project) never pass.
FORWARDED_HEADERS = {
    "content-type", "accept", "accept-language", "user-agent", "idempotency-key",
    "anthropic-version", "anthropic-beta", "anthropic-dangerous-direct-browser-access", "x-app",
    "x-claude-code-session-id", "openai-beta", "originator", "session-id", "thread-id",
    "x-client-request-id", "x-session-id", "x-session-affinity", "x-goog-api-client",
    "amz-sdk-invocation-id", "amz-sdk-request", "x-amz-user-agent",
}  # fmt: skip
FORWARDED_PREFIXES = ("x-stainless-", "x-codex-", "x-amzn-bedrock-")


def _paths(*rows: tuple[str, str]) -> tuple[tuple[str, re.Pattern[str]], ...]:
    return tuple((method, re.compile(pattern, re.ASCII)) for method, pattern in rows)


_MODEL = r"[\w.@-]+"
# Each API's paths below its prefix (`/anthropic/...`), by method, once percent-decoded.
API_PATHS = {
    "anthropic": _paths(("POST", r"v1/messages(/count_tokens)?"), ("GET", rf"v1/models(/{_MODEL})?")),
    "openai": _paths(
        ("POST", r"(v1/)?(responses|responses/input_tokens|chat/completions)"),
        ("GET", rf"(v1/)?models(/{_MODEL})?"),
    ),
    "gemini": _paths(
        ("POST", rf"v1(beta|alpha)?/models/{_MODEL}:(generateContent|streamGenerateContent|countTokens)"),
        ("GET", rf"v1(beta|alpha)?/models(/{_MODEL})?"),
    ),
    "vertex": _paths(
        ("POST", rf"(v1/)?projects/[\w.-]+/locations/[\w-]+/publishers/anthropic/models/{_MODEL}"
                 r":(rawPredict|streamRawPredict)"),
    ),
    # A model id, or an inference profile's ARN (whose "/" the client sends as %2F).
    "bedrock": _paths(
        ("POST", r"model/([\w.:-]+|arn:aws[\w-]*:bedrock:[\w-]+:\d+:[\w-]+/[\w.:-]+)"
                 r"/(invoke|invoke-with-response-stream|count-tokens)"),
        ("GET", r"inference-profiles"),  # Claude Code lists them to resolve its model
    ),
}  # fmt: skip
# A request target as clients send one: a path and a query of URI characters, nothing else.
_TARGET = re.compile(r"/[\w\-.~!$&'()*+,;=:@/%]*(\?[\w\-.~!$&'()*+,;=:@/%?]*)?", re.ASCII)
MAX_CONNECTIONS = 32  # a trial's connections at once (a thread each); Claude Code uses a few
MAX_HEAD = 64 << 10  # a request line and its headers
MAX_BODY = 32 << 20  # a request body: the Anthropic API's own limit
MAX_HELD = 96 << 20  # all the request bodies of a trial held at once
IDLE_SECONDS = 30.0  # a connection waiting for its (next) request
REQUEST_SECONDS = 60.0  # a request's headers and body, from its first line
SEND_SECONDS = 120.0  # one write to an agent that does not read its answer
BAD_CHUNKS = "a malformed or unfinished chunked body"
GEMINI_GENERATE, GEMINI_STREAM = ":generateContent", ":streamGenerateContent"
# The paths that ask a model for an answer (others: token counts, model lists...).
GENERATIONS = (
    "/messages", "/responses", "/chat/completions", GEMINI_GENERATE, GEMINI_STREAM,
    ":rawPredict", ":streamRawPredict", "/invoke", "/invoke-with-response-stream",
)  # fmt: skip
_BUSY = json.dumps(
    {"type": "error", "error": {"type": "evalsite_gateway", "message": "too many connections at once"}}
).encode()
BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_BUSY), _BUSY)
)


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
    block_on_close = False  # close() ends the connections itself
    allow_reuse_address = True
    request_queue_size = 64  # a burst of connections waits to be accepted (or refused), not failed
    gateway: Gateway

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread for the connection, or, past the trial's cap, a 503 from here at once."""
        if not self.gateway._open(request):
            with contextlib.suppress(OSError):
                request.setblocking(False)  # never wait on the agent in the accepting thread
                request.send(BUSY_RESPONSE)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.gateway._closed(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.gateway._closed(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], OSError):  # an agent that hung up is no news
            super().handle_error(request, client_address)


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
        # Forwarded calls the model's API failed (5xx, unreachable, refused the key, rate-limited):
        # what makes an agent's "the API failed" an infrastructure error rather than its own.
        self.upstream_failures = 0
        self.crossed: str | None = None
        self.events: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._in_flight = 0
        self._connections: set[socket.socket] = set()
        self._held = 0
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
        with self._lock:
            connections = list(self._connections)
        for connection in connections:  # their threads see the end and leave
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
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

    def _open(self, connection: socket.socket) -> bool:
        """Whether another connection may be served (MAX_CONNECTIONS at once)."""
        with self._lock:
            if len(self._connections) >= MAX_CONNECTIONS:
                return False
            self._connections.add(connection)
            return True

    def _closed(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.discard(connection)

    def _hold(self, size: int) -> bool:
        """Whether `size` more bytes of request bodies may be held (MAX_HELD for the trial)."""
        with self._lock:
            if self._held + size > MAX_HELD:
                return False
            self._held += size
            return True

    def _release(self, size: int) -> None:
        with self._lock:
            self._held -= size

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

    def admit(self, call: Call) -> str | None:
        """Why `call` is refused (a budget crossed, or the calls used up), else None. A model call
        takes its turn here, before it is forwarded: counted only when they ended, ten calls made
        at once all went out under `max_turns: 2`."""
        with self._lock:
            if self.crossed is None and call.is_generation:
                max_turns = self.limits.get("max_turns")
                if max_turns is not None and self.calls >= max_turns:
                    self.crossed = "max_turns"
                else:
                    self.calls += 1
                    self.usage.turns = self.calls
            return self.crossed

    def attempt_of(self, body: bytes | bytearray) -> int:
        digest = hashlib.sha256(body).hexdigest()
        with self._lock:
            self._bodies[digest] = self._bodies.get(digest, 0) + 1
            return self._bodies[digest]

    def record(self, call: Call) -> None:
        """A call's usage and cost, once it has ended (its turn was taken by `admit`)."""
        prices = model_prices(call.model, self.prices)
        if prices is not None:
            call.cost_usd = estimate_cost(call.usage, prices)
        with self._lock:
            if call.status >= 500 or call.status in (401, 403, 408, 429):
                self.upstream_failures += 1
            for name in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_creation_tokens",
                         "reasoning_tokens"):  # fmt: skip
                setattr(self.usage, name, getattr(self.usage, name) + getattr(call.usage, name))
            if call.cost_usd is not None:
                self.cost_usd += call.cost_usd
            elif call.model:
                self.unpriced.add(call.model)
            self.usage.cost_usd = self.cost_usd
            limits = {k: v for k, v in self.limits.items() if k != "max_turns"}  # turns: admit()
            if self.crossed is None:
                self.crossed = budget_crossed(self.usage, limits)
        self.events.put(call.event())

    def watch(self, call: Call) -> None:
        """A budget crossed by what `call` has used so far, its answer still coming, is crossed
        at once: no other call goes out (a long stream may have gone past it already)."""
        partial = Usage(**{**call.usage.__dict__})
        prices = model_prices(call.model, self.prices)
        partial.cost_usd = estimate_cost(partial, prices) if prices is not None else None
        limits = {k: v for k, v in self.limits.items() if k != "max_turns"}
        with self._lock:
            if self.crossed is None:
                self.crossed = budget_crossed(summed([self.usage, partial]), limits)

    def totals(self) -> Usage:
        with self._lock:
            return Usage(**{**self.usage.__dict__})


class _Refused(Exception):
    """A request the gateway answers itself, with `status`, and never forwards."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class _HeadTooLarge(Exception):
    pass


class _Reader(io.RawIOBase):
    """The agent's side of a connection as the handler reads it: no read goes past `deadline`,
    and at most `allowance` more bytes are taken (a request's head is bounded before it is
    parsed). Between reads, the socket waits SEND_SECONDS for each write."""

    def __init__(self, connection: socket.socket) -> None:
        self.connection = connection
        self.deadline = math.inf
        self.allowance = math.inf

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request took too long")
        if self.allowance <= 0:
            raise _HeadTooLarge
        view = memoryview(buffer).cast("B")
        if self.allowance < len(view):
            view = view[: int(self.allowance)]
        self.connection.settimeout(left)
        try:
            got = self.connection.recv_into(view)
        finally:
            self.connection.settimeout(SEND_SECONDS)
        self.allowance -= got
        return got


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    reader: _Reader
    held: int

    @property
    def gateway(self) -> Gateway:
        return self.server.gateway

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # replaced by one that bounds every read
        self.reader = _Reader(self.connection)
        self.rfile = io.BufferedReader(self.reader, 65536)

    def handle_one_request(self) -> None:
        self.reader.deadline = time.monotonic() + IDLE_SECONDS
        self.reader.allowance = MAX_HEAD
        try:
            super().handle_one_request()
        except _HeadTooLarge:
            self.close_connection = True  # its head is still coming: nothing sensible to answer

    def parse_request(self) -> bool:
        # The request line has come: its headers and body get REQUEST_SECONDS.
        self.reader.deadline = time.monotonic() + REQUEST_SECONDS
        parsed = super().parse_request()
        self.reader.allowance = math.inf  # a body is bounded by its own reading
        return parsed

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
        self.gateway._enter()
        self.held = 0  # the bytes of this request's body held against MAX_HELD
        try:
            self._proxy()
        except _Refused as refused:
            self._error(refused.status, refused.message)
        finally:
            self.gateway._release(self.held)
            self.gateway._leave()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_GET

    def _proxy(self) -> None:
        api, rest, query = _api_path(self.command, self.path, self.gateway.upstreams)
        body = self._body()
        call = Call(api, "/" + rest + query, 0)
        refused = self.gateway.admit(call)
        if refused:
            self.gateway.events.put({"source": "gateway", "api": api, "refused": refused, "path": call.path})
            message = f"evalsite: the trial's {refused} budget is used up; the agent is being stopped"
            raise _Refused(429, message)
        call.attempt = self.gateway.attempt_of(body)
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            request = json.loads(body) if body else {}
            call.model = str(request.get("model") or "") if isinstance(request, dict) else ""
            call.stream = bool(isinstance(request, dict) and request.get("stream"))
        if api in ("gemini", "vertex"):  # the model is in the path: models/M:streamGenerateContent
            call.model = call.model or _gemini_model(rest)
            call.stream = call.stream or "stream" in rest.rpartition(":")[2].lower()
        elif api == "bedrock":  # model/M/invoke-with-response-stream
            call.model = call.model or unquote(rest.partition("model/")[2].rpartition("/")[0])
            call.stream = rest.endswith("-with-response-stream")
        started = time.perf_counter()
        try:
            self._forward(self.gateway.upstreams[api], rest + query, body, call, started)
        finally:
            if not call.recorded:
                self.gateway.record(call)

    def _body(self) -> bytes | bytearray:
        """The request's whole body, within REQUEST_SECONDS and MAX_BODY, or _Refused: nothing is
        forwarded before all of it has come (an early end or a bad framing is never passed on)."""
        chunked = self.headers.get_all("Transfer-Encoding") or []
        lengths = self.headers.get_all("Content-Length") or []
        try:
            if chunked:
                if lengths or [value.strip().lower() for value in chunked] != ["chunked"]:
                    raise _Refused(400, "Transfer-Encoding must be chunked alone, without Content-Length")
                return self._chunked_body()
            if len(lengths) > 1 or not all(value.isascii() and value.isdigit() for value in lengths):
                raise _Refused(400, "Content-Length must be one whole number")
            length = int(lengths[0]) if lengths else 0
            self._hold(length, length)
            body = self.rfile.read(length) if length else b""
            if len(body) < length:
                raise _Refused(400, "the request ended before its body did")
            return body
        except TimeoutError:
            raise _Refused(408, f"the request did not arrive within {REQUEST_SECONDS:.0f} s") from None

    def _chunked_body(self) -> bytearray:
        """A chunked body, read only while it stays within MAX_BODY (each chunk is checked before
        it is read), up to its last chunk and the empty line after it."""
        body = bytearray()
        while True:
            line = self.rfile.readline(1024)
            size = line.split(b";", 1)[0].strip()
            if not line.endswith(b"\n") or not re.fullmatch(rb"[0-9a-fA-F]{1,8}", size):
                raise _Refused(400, BAD_CHUNKS)
            if (length := int(size, 16)) == 0:
                break
            self._hold(length, len(body) + length)
            chunk = self.rfile.read(length)
            if len(chunk) < length or self.rfile.read(2) != b"\r\n":
                raise _Refused(400, BAD_CHUNKS)
            body += chunk
        for _ in range(32):  # trailer fields, up to the empty line that ends the body
            line = self.rfile.readline(1024)
            if line in (b"\r\n", b"\n"):
                return body
            if not line.endswith(b"\n"):
                break
        raise _Refused(400, BAD_CHUNKS)

    def _hold(self, size: int, total: int) -> None:
        """`size` more bytes of a body that is then `total` long, within MAX_BODY and what the
        trial may hold at once (MAX_HELD), or _Refused."""
        if total > MAX_BODY:
            raise _Refused(413, f"the request body is larger than {MAX_BODY} bytes")
        if not self.gateway._hold(size):
            raise _Refused(503, "too many large requests at once")
        self.held += size

    def _forward(
        self, upstream: Upstream, rest: str, body: bytes | bytearray, call: Call, started: float
    ) -> None:
        target = urlsplit(upstream.base_url)
        base_path = target.path.rstrip("/")
        if upstream.api == "openai" and base_path.endswith("/v1") and rest.startswith("v1/"):
            rest = rest[3:]  # the agent was given .../openai/v1: do not double the /v1
        if upstream.api == "gemini":
            rest = _without_query_key(rest)  # the key goes in a header, the agent's placeholder nowhere
        path = f"{base_path}/{rest}"
        headers = {
            name: value
            for name, value in self.headers.items()
            if name.lower() in FORWARDED_HEADERS or name.lower().startswith(FORWARDED_PREFIXES)
        }
        headers.update(upstream.auth_headers())
        headers["Accept-Encoding"] = "identity"  # usage is read from the body
        connection_class = (
            http.client.HTTPSConnection if target.scheme == "https" else http.client.HTTPConnection
        )
        # run_limits.turn_timeout: a model call that stays silent this long is abandoned. The turn
        # itself is killed then (agent_phase); this frees the gateway's thread and connection too.
        timeout = float(self.gateway.limits.get("turn_timeout") or 600)
        conn = connection_class(target.hostname or "", target.port, timeout=timeout)
        try:
            conn.request(self.command, path, body=body or None, headers=headers)
            response = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            call.status = 502
            call.latency_ms = (time.perf_counter() - started) * 1000
            conn.close()
            raise _Refused(502, f"the model server at {upstream.base_url} cannot be reached: {exc}") from None
        try:
            self._relay(response, call, started)
        finally:
            conn.close()

    def _relay(self, response: http.client.HTTPResponse, call: Call, started: float) -> None:
        """The response passed on as it comes (never held whole). The call is recorded before the
        agent gets the response's last bytes: an agent that exits the moment it has its answer
        must not leave a call uncounted."""
        call.status = response.status
        reader = _UsageReader(call.api, call)
        self.send_response_only(response.status, response.reason)  # its own Server and Date follow
        for name, value in response.getheaders():
            if name.lower() not in HOP_BY_HOP:
                self.send_header(name, value)
        chunked = response.length is None  # streamed, or ended by closing: passed on in chunks
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(response.length))
        self.end_headers()
        broken = False
        try:
            while chunk := response.read1(65536):
                reader.feed(chunk)
                if chunked:
                    self.gateway.watch(call)
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    continue
                if not response.length:
                    self._record(reader, call, started)
                self.wfile.write(chunk)
        except http.client.HTTPException:  # a chunked answer broken off
            broken = True
        finally:
            if not call.recorded:  # also what came before the server or the agent broke off
                self._record(reader, call, started)
        if broken or response.length:  # the model server broke off: so must the answer
            self.close_connection = True
        elif chunked:
            self.wfile.write(b"0\r\n\r\n")

    def _record(self, reader: _UsageReader, call: Call, started: float) -> None:
        reader.finish()
        call.latency_ms = (time.perf_counter() - started) * 1000
        self.gateway.record(call)
        call.recorded = True

    def _error(self, status: int, message: str) -> None:
        body = json.dumps(
            {"type": "error", "error": {"type": "evalsite_gateway", "message": message}}
        ).encode()
        self.close_connection = True  # what is left of a refused request is never read
        with contextlib.suppress(OSError):  # an agent that broke off gets no answer
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)


def _api_path(method: str, target: str, upstreams: dict[str, Upstream]) -> tuple[str, str, str]:
    """The API a request goes to, its path below it and its query ("?..." or ""), or _Refused
    unless the path is a plain one (no `.`, `..` or empty part, nothing encoded that decodes to
    a separator or a `%`) and one of the API's own (`API_PATHS`)."""
    if not _TARGET.fullmatch(target):
        raise _Refused(400, "the request target must be a plain path (and query)")
    path, mark, query = target.partition("?")
    try:
        decoded = unquote(path, errors="strict") if "%" in path else path
    except UnicodeDecodeError:
        decoded = "%"
    if "%" in decoded or any(part in ("", ".", "..") for part in decoded.split("/")[1:]):
        raise _Refused(400, f"{path} is not a plain path: no '.', '..', '//' or encoded separators")
    api, _, rest = path[1:].partition("/")
    if api not in upstreams:
        raise _Refused(404, f"the gateway forwards only to {', '.join(upstreams) or 'nothing'}")
    if not any(method == verb and pattern.fullmatch(unquote(rest)) for verb, pattern in API_PATHS[api]):
        raise _Refused(403, f"{method} /{api}/{rest} is not an API call the gateway forwards")
    return api, rest, mark + query


class _UsageReader:
    """Reads a response's usage and model as it passes, whether JSON, Server-Sent Events or an AWS
    event stream (Bedrock), holding little of it: the unfinished line or frame of a stream, at
    most MAX_JSON of a JSON answer (whose usage comes last: a larger one keeps its end)."""

    MAX_JSON = 4 << 20
    MAX_EVENT = 1 << 20  # an SSE line or event-stream frame; a longer one is skipped

    def __init__(self, api: str, call: Call) -> None:
        self.api, self.call = api, call
        self.form = ""  # "json", "sse" or "frames", from the first bytes
        self.pending = bytearray()
        self.cut = False  # a JSON answer's start was dropped

    def feed(self, data: bytes) -> None:
        if not self.form:
            first = data.lstrip()[:1]
            if not first:
                return
            if self.api == "bedrock" and data[:1] != b"{":
                self.form = "frames"
            else:
                self.form = "json" if first in (b"{", b"[") else "sse"
        self.pending += data
        if self.form == "json":
            if len(self.pending) > self.MAX_JSON:
                del self.pending[: len(self.pending) - self.MAX_JSON]
                self.cut = True
        elif self.form == "sse":
            end = self.pending.rfind(b"\n")
            if end >= 0:
                for line in self.pending[:end].splitlines():
                    self._line(line)
                del self.pending[: end + 1]
            if len(self.pending) > self.MAX_EVENT:
                self.pending.clear()
        else:
            self._frames()

    def finish(self) -> None:
        if self.form == "sse":
            self._line(self.pending)
        elif self.form == "json" and self.cut:
            self._usage_at_end(self.pending.decode("utf-8", "replace"))
        elif self.form == "json":
            with contextlib.suppress(ValueError):
                answer = json.loads(self.pending)
                for obj in answer if isinstance(answer, list) else [answer]:  # Gemini streams a list
                    self._read(obj)
        self.pending.clear()

    def _line(self, line: bytes | bytearray) -> None:
        if line.startswith(b"data:"):
            with contextlib.suppress(ValueError):
                self._read(json.loads(line[5:]))

    def _frames(self) -> None:
        """The complete frames of an AWS event stream: total length, headers length and a prelude
        CRC (4 bytes each), the headers, the payload (an event in base64 JSON), a message CRC."""
        while len(self.pending) >= 12:
            total, headers = struct.unpack_from(">II", self.pending)
            if total < 16 or total > self.MAX_EVENT:
                self.form = "broken"  # not an event stream after all
                self.pending.clear()
                return
            if len(self.pending) < total:
                return
            payload = bytes(self.pending[12 + headers : total - 4])
            del self.pending[:total]
            with contextlib.suppress(ValueError, TypeError, KeyError, binascii.Error):
                self._read(json.loads(base64.b64decode(json.loads(payload)["bytes"])))

    def _usage_at_end(self, text: str) -> None:
        """The usage of a JSON answer too large to hold, from its end, where every API puts it."""
        at = max(text.rfind('"usage"'), text.rfind('"usageMetadata"'))
        start = text.find("{", at)
        if at < 0 or start < 0:
            return
        with contextlib.suppress(ValueError):
            usage, _ = json.JSONDecoder().raw_decode(text, start)
            if not isinstance(usage, dict):
                return
            if text.startswith('"usageMetadata"', at):
                self._gemini({"usageMetadata": usage})
            elif "prompt_tokens" in usage:
                self._chat({"usage": usage})
            elif self.api == "openai":
                self._responses({"usage": usage})
            else:
                self._anthropic({"usage": usage})

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
