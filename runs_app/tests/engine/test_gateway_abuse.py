"""The model gateway under abuse, without a worker. An agent, or anything in its sandbox that
reaches the gateway's socket directly, cannot overrun a budget, get an incomplete or malformed
request forwarded, use up the worker's threads or memory, leave the APIs' own paths, or pass
its own headers upstream. `test_a_hostile_agent_gets_nothing_from_the_gateway` tries the same
attacks from inside a sandbox, through a real worker."""

import contextlib
import json
import select
import socket
import threading
import time
import tracemalloc
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import WorkerProcess, purge_broker
from runs_app.engine.gateway import Call, Gateway, Upstream, proxy
from runs_app.launching import launch_run
from runs_app.models import Trial
from runs_app.tests.factories import import_folder_tasks, make_experiment, make_task
from runs_app.tests.mock_servers import AnthropicMock, Turn, text
from runs_app.tests.workers import wait_for_run

REAL_KEY = "sk-ant-real-key-only-the-gateway-holds"
BODY = json.dumps(
    {"model": "claude-sonnet-4-6", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
).encode()
REPLY = json.dumps(
    {"type": "message", "model": "claude-sonnet-4-6", "usage": {"input_tokens": 100, "output_tokens": 10}}
).encode()


class RecordingUpstream:
    """A model server that records every request it gets and answers each after `delay`."""

    def __init__(self) -> None:
        self.delay = 0.0
        self.requests: list[dict] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {name.lower(): value for name, value in self.headers.items()}
                recorder.requests.append({"method": self.command, "path": self.path, "headers": headers,
                                          "body": body})  # fmt: skip
                if body.startswith(b'{"stream": true'):
                    self.stream()
                    return
                time.sleep(recorder.delay)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(REPLY)))
                self.end_headers()
                self.wfile.write(REPLY)

            do_GET = do_PUT = do_DELETE = do_PATCH = do_POST

            def stream(self) -> None:
                """An Anthropic stream whose input tokens come first, its end after `delay`."""
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                start = {"type": "message_start", "message": {"usage": {"input_tokens": 5000}}}
                self.wfile.write(f"event: message_start\ndata: {json.dumps(start)}\n\n".encode())
                self.wfile.flush()
                time.sleep(recorder.delay)
                end = {"type": "message_delta", "usage": {"output_tokens": 3}}
                self.wfile.write(f"event: message_delta\ndata: {json.dumps(end)}\n\n".encode())
                self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        serve = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        serve.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def upstream():
    server = RecordingUpstream()
    yield server
    server.server.shutdown()
    server.server.server_close()


@pytest.fixture
def start_gateway(tmp_path, upstream):
    """Starts the trial's gateway, every API of it forwarding to `upstream`."""
    started = []

    def start(limits: dict | None = None) -> Gateway:
        apis = [Upstream(api, upstream.url, REAL_KEY) for api in ("anthropic", "gemini", "vertex", "bedrock")]
        apis.append(Upstream("openai", f"{upstream.url}/v1", REAL_KEY))
        gateway = Gateway(tmp_path / "g.sock", apis, limits=limits).start()
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        gateway.close()


def request(path: str = "/anthropic/v1/messages", body: bytes = BODY, headers: str = "") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return (head + headers + "Connection: close\r\n\r\n").encode() + body


def exchange(gateway: Gateway, raw: bytes, half_close: bool = False, timeout: float = 10.0) -> bytes:
    """`raw` sent on a new connection to the gateway's socket; all it answers until it closes
    (a request refused before it was all sent breaks the sending off, not the answer)."""
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(timeout)
        conn.connect(str(gateway.socket_path))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.sendall(raw)
            if half_close:
                conn.shutdown(socket.SHUT_WR)
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := conn.recv(65536):
                answer += chunk
        return answer


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0


def wait_until(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# --- budgets --------------------------------------------------------------------------------------


def test_calls_made_at_once_beyond_max_turns_are_refused_and_stop_the_agent(start_gateway, upstream):
    upstream.delay = 0.3  # all ten are in flight before the first has ended
    gateway = start_gateway({"max_turns": 2})
    barrier, statuses = threading.Barrier(10), []

    def call() -> None:
        barrier.wait()
        statuses.append(status(exchange(gateway, request())))

    threads = [threading.Thread(target=call) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(statuses) == [200, 200] + [429] * 8
    assert len(upstream.requests) == 2
    assert gateway.stop_reason() == "max_turns"
    assert gateway.totals().turns == 2
    refused = [event for event in gateway.drain() if event.get("refused")]
    assert len(refused) == 8 and {event["refused"] for event in refused} == {"max_turns"}


def test_once_a_token_budget_is_crossed_no_call_is_forwarded(start_gateway, upstream):
    gateway = start_gateway({"max_output_tokens": 5})  # each answer: 10 output tokens

    assert status(exchange(gateway, request())) == 200
    assert gateway.stop_reason() == "max_output_tokens"
    assert status(exchange(gateway, request())) == 429
    assert status(exchange(gateway, request("/anthropic/v1/messages/count_tokens"))) == 429
    assert len(upstream.requests) == 1


def test_a_budget_crossed_while_an_answer_streams_refuses_the_next_call_at_once(start_gateway, upstream):
    upstream.delay = 1.5
    gateway = start_gateway({"max_input_tokens": 1000})
    streamed = threading.Thread(target=exchange, args=(gateway, request(body=b'{"stream": true}')))
    streamed.start()

    assert wait_until(lambda: gateway.stop_reason() == "max_input_tokens", timeout=1.0)  # mid-stream
    assert status(exchange(gateway, request())) == 429
    streamed.join()
    assert len(upstream.requests) == 1 and gateway.totals().input_tokens == 5000


# --- request framing -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "framing",
    [
        "Content-Length: -1\r\n",
        "Content-Length: abc\r\n",
        "Content-Length: 1e3\r\n",
        "Content-Length: +12\r\n",
        "Content-Length: 0x0c\r\n",
        "Content-Length: 12\r\nContent-Length: 13\r\n",
        "Content-Length: 12\r\nTransfer-Encoding: chunked\r\n",
        "Transfer-Encoding: gzip, chunked\r\n",
        "Transfer-Encoding: identity\r\n",
    ],
)
def test_a_bad_content_length_or_transfer_encoding_gets_400_and_nothing_is_forwarded(
    start_gateway, upstream, framing
):
    gateway = start_gateway()
    raw = f"POST /anthropic/v1/messages HTTP/1.1\r\n{framing}Connection: close\r\n\r\n".encode() + BODY[:12]

    assert status(exchange(gateway, raw)) == 400
    assert upstream.requests == []


def test_a_body_over_the_cap_gets_413_before_it_is_read(start_gateway, upstream):
    gateway = start_gateway()
    raw = f"POST /anthropic/v1/messages HTTP/1.1\r\nContent-Length: {proxy.MAX_BODY + 1}\r\n\r\n".encode()

    assert status(exchange(gateway, raw, timeout=2)) == 413  # answered without waiting for the body
    assert upstream.requests == []


CHUNKED = b"POST /anthropic/v1/messages HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"


@pytest.mark.parametrize(
    "raw",
    [
        request(body=BODY)[: -len(BODY) // 2],  # half of the body, then the end
        CHUNKED + b"%x\r\n" % len(BODY) + BODY + b"\r\n",  # no last chunk
        CHUNKED + b"%x\r\n" % len(BODY) + BODY[:-5],  # a chunk cut short
        CHUNKED + b"%x\r\n" % len(BODY) + BODY + b"\r\n0\r\n",  # no empty line after the last chunk
        CHUNKED + b"zz\r\n" + BODY + b"\r\n0\r\n\r\n",  # a chunk size that is not one
    ],
    ids=["content-length", "no-last-chunk", "short-chunk", "no-final-line", "bad-size"],
)
def test_an_incomplete_body_is_never_forwarded(start_gateway, upstream, raw):
    gateway = start_gateway()

    assert status(exchange(gateway, raw, half_close=True)) == 400
    assert upstream.requests == []


def test_a_complete_chunked_body_is_forwarded_whole(start_gateway, upstream):
    gateway = start_gateway()
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (BODY[:10], BODY[10:]))
    raw = CHUNKED + chunks + b"0\r\n\r\n"

    assert status(exchange(gateway, raw)) == 200
    assert [r["body"] for r in upstream.requests] == [BODY]


def test_a_body_that_stops_coming_gets_408_and_is_not_forwarded(start_gateway, upstream, monkeypatch):
    monkeypatch.setattr(proxy, "REQUEST_SECONDS", 0.5)
    gateway = start_gateway()
    started = time.monotonic()

    assert status(exchange(gateway, request()[:-10])) == 408  # the connection stays open, silent
    assert time.monotonic() - started < 3
    assert upstream.requests == []


def test_a_chunked_body_over_the_cap_gets_413_and_is_never_held(start_gateway, upstream, monkeypatch):
    monkeypatch.setattr(proxy, "MAX_BODY", 4 << 20)
    gateway = start_gateway()
    chunk = b"100000\r\n" + b"x" * 0x100000 + b"\r\n"  # 1 MiB
    sent = 0
    tracemalloc.start()
    try:
        with socket.socket(socket.AF_UNIX) as conn:
            conn.settimeout(10)
            conn.connect(str(gateway.socket_path))
            conn.sendall(CHUNKED)
            with pytest.raises(OSError):  # the gateway stops reading and hangs up
                for _ in range(64):
                    conn.sendall(chunk)
                    sent += 1
            answer = conn.recv(65536)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    assert status(answer) == 413
    assert sent < 16 and peak < 16 << 20, (sent, peak)  # 64 MiB offered
    assert upstream.requests == []


def test_the_bodies_a_trial_holds_at_once_are_capped(start_gateway, upstream, monkeypatch):
    monkeypatch.setattr(proxy, "MAX_HELD", 1 << 20)
    gateway = start_gateway()
    big = b'{"model": "claude-sonnet-4-6", "pad": "' + b"x" * (700 << 10) + b'"}'
    with socket.socket(socket.AF_UNIX) as slow:
        slow.connect(str(gateway.socket_path))
        slow.sendall(request(body=big)[:-100])  # holds its 700 KiB while the rest is awaited
        time.sleep(0.2)

        assert status(exchange(gateway, request(body=big))) == 503
        assert status(exchange(gateway, request())) == 200  # small bodies still fit
        slow.sendall(request(body=big)[-100:])
        assert status(slow.recv(65536)) == 200
    # released once the slow one has been answered
    assert wait_until(lambda: status(exchange(gateway, request(body=big))) == 200)


# --- connections and reads ---------------------------------------------------------------------


def test_a_connection_flood_keeps_threads_bounded_and_a_call_gets_through_or_a_quick_503(start_gateway):
    gateway = start_gateway()
    before = threading.active_count()
    flood = []
    for _ in range(200):
        conn = socket.socket(socket.AF_UNIX)
        conn.connect(str(gateway.socket_path))
        flood.append(conn)
    try:
        # Past the cap, each is answered 503 at once; those within it wait for their request.
        answered = lambda: len(select.select(flood, [], [], 0)[0])  # noqa: E731
        assert wait_until(lambda: answered() == len(flood) - proxy.MAX_CONNECTIONS)
        assert threading.active_count() <= before + proxy.MAX_CONNECTIONS
        assert {status(conn.recv(4096)) for conn in select.select(flood, [], [], 0)[0]} == {503}
        started = time.monotonic()
        assert status(exchange(gateway, request())) in (200, 503)
        assert time.monotonic() - started < 1
    finally:
        for conn in flood:
            conn.close()

    assert wait_until(lambda: threading.active_count() <= before)
    assert status(exchange(gateway, request())) == 200


def test_idle_slow_and_oversized_requests_are_cut_off(start_gateway, upstream, monkeypatch):
    monkeypatch.setattr(proxy, "IDLE_SECONDS", 0.3)
    monkeypatch.setattr(proxy, "REQUEST_SECONDS", 0.6)
    gateway = start_gateway()
    before = threading.active_count()
    started = time.monotonic()
    with socket.socket(socket.AF_UNIX) as idle, socket.socket(socket.AF_UNIX) as slow:
        idle.settimeout(5)
        slow.settimeout(5)
        idle.connect(str(gateway.socket_path))
        slow.connect(str(gateway.socket_path))
        slow.sendall(b"POST /anthropic/v1/messages HTTP/1.1\r\n")
        with pytest.raises(OSError):  # a header byte at a time: cut off at the request's deadline
            for _ in range(50):
                slow.sendall(b"X")
                time.sleep(0.05)
        assert idle.recv(1) == b""
    assert time.monotonic() - started < 2.5
    # headers without end: cut off at MAX_HEAD, not read on
    huge = b"POST /anthropic/v1/messages HTTP/1.1\r\nX-Pad: " + b"x" * 60000 + b"\r\nX-More: " + b"y" * 10000
    assert exchange(gateway, huge + b"\r\n", timeout=5) == b""
    assert wait_until(lambda: threading.active_count() <= before)
    assert upstream.requests == []


# --- paths and headers -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "target"),
    [
        ("POST", "/anthropic/../../v1/messages"),
        ("POST", "/anthropic/v1/../../../v1/messages"),
        ("POST", "/anthropic/v1/messages/.."),
        ("POST", "/anthropic//v1/messages"),
        ("POST", "/anthropic/v1//messages"),
        ("POST", "/anthropic/v1/./messages"),
        ("POST", "/anthropic/%2e%2e/%2e%2e/v1/messages"),
        ("POST", "/anthropic/v1%2f..%2f..%2fv1/messages"),
        ("POST", "/anthropic/v1%2F%2Fmessages"),
        ("POST", "/anthropic/%252e%252e/v1/messages"),
        ("POST", "/anthropic/v1/messages%00"),
        ("POST", "/anthropic/v1/messages%ff"),
        ("POST", "/anthropic/v1\\..\\..\\x"),
        ("POST", "/anthropic/v1/messages#x"),
        ("POST", "http://127.0.0.1:5432/anthropic/v1/messages"),
        ("POST", "/anthropic/api/oauth/profile"),
        ("POST", "/anthropic/v1/files"),
        ("POST", "/anthropic/v1/messages/batches"),
        ("POST", "/anthropic/v1/models/../../x"),
        ("HEAD", "/anthropic"),
        ("GET", "/anthropic/v1/messages"),
        ("DELETE", "/anthropic/v1/models/claude-sonnet-4-6"),
        ("POST", "/openai/../anthropic/v1/messages"),
        ("POST", "/openai/v1/files"),
        ("POST", "/openai/v1/responses/../../organization/admin_api_keys"),
        ("POST", "/gemini/v1beta/models/gemini-2.5-pro:generateContent/../../../../v1/files"),
        ("POST", "/gemini/v1beta/files"),
        ("POST", "/vertex/projects/p/locations/l/publishers/google/models/gemini:generateContent"),
        ("POST", "/bedrock/model/a%2F..%2Fb/invoke"),
        ("POST", "/bedrock/guardrail/x/version/1/apply"),
        ("POST", "/azure/v1/messages"),
    ],
)
def test_paths_outside_the_apis_are_refused_and_never_forwarded(start_gateway, upstream, method, target):
    gateway = start_gateway()
    raw = f"{method} {target} HTTP/1.1\r\nContent-Length: {len(BODY)}\r\nConnection: close\r\n\r\n"

    assert status(exchange(gateway, raw.encode() + BODY)) in (400, 403, 404)
    assert upstream.requests == []


@pytest.mark.parametrize(
    ("method", "target", "forwarded"),
    [
        # What Claude Code, Codex, the Gemini CLI, opencode and Aider call (seen through the tests
        # that run them), and the APIs' token counts and model lists.
        ("POST", "/anthropic/v1/messages?beta=true", "/v1/messages?beta=true"),
        ("POST", "/anthropic/v1/messages/count_tokens?beta=true", "/v1/messages/count_tokens?beta=true"),
        ("GET", "/anthropic/v1/models", "/v1/models"),
        ("POST", "/openai/v1/responses", "/v1/responses"),
        ("POST", "/openai/v1/chat/completions", "/v1/chat/completions"),
        ("GET", "/openai/v1/models/gpt-5", "/v1/models/gpt-5"),
        (
            "POST",
            "/gemini/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse&key=placeholder",
            "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse",
        ),
        ("POST", "/gemini/v1/models/gemini-2.5-pro:countTokens", "/v1/models/gemini-2.5-pro:countTokens"),
        ("GET", "/gemini/v1beta/models", "/v1beta/models"),
        (
            "POST",
            "/vertex/projects/evals-1/locations/europe-west1/publishers/anthropic/models/"
            "claude-sonnet-4-6@20250929:streamRawPredict",
            "/projects/evals-1/locations/europe-west1/publishers/anthropic/models/"
            "claude-sonnet-4-6@20250929:streamRawPredict",
        ),
        (
            "POST",
            "/bedrock/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke-with-response-stream",
            "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke-with-response-stream",
        ),
        (
            "POST",
            "/bedrock/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Aapplication-inference-profile"
            "%2Fabc123/invoke",
            "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Aapplication-inference-profile%2Fabc123"
            "/invoke",
        ),
        ("GET", "/bedrock/inference-profiles?type=SYSTEM_DEFINED", "/inference-profiles?type=SYSTEM_DEFINED"),
    ],
)
def test_the_api_paths_the_real_clis_call_are_forwarded_as_sent(
    start_gateway, upstream, method, target, forwarded
):
    gateway = start_gateway()
    raw = f"{method} {target} HTTP/1.1\r\nContent-Length: {len(BODY)}\r\nConnection: close\r\n\r\n"

    assert status(exchange(gateway, raw.encode() + BODY)) == 200
    assert [(r["method"], r["path"]) for r in upstream.requests] == [(method, forwarded)]


def test_only_the_apis_own_headers_reach_the_upstream(start_gateway, upstream):
    gateway = start_gateway()
    hostile = {
        "Host": "evil.test", "X-Forwarded-For": "10.9.9.9", "X-Forwarded-Host": "evil.test",
        "X-Forwarded-Proto": "gopher", "Forwarded": "for=10.9.9.9;host=evil.test", "X-Real-IP": "10.9.9.9",
        "Cookie": "session=hostile", "Authorization": "Bearer hostile", "X-Api-Key": "hostile",
        "Proxy-Authorization": "Basic aG9zdGlsZQ==", "OpenAI-Organization": "org-hostile",
        "X-Goog-User-Project": "hostile", "X-Hostile": "hostile", "Via": "1.1 evil.test",
    }  # fmt: skip
    wanted = {"anthropic-version": "2023-06-01", "anthropic-beta": "context-1m", "x-stainless-lang": "js",
              "user-agent": "claude-cli/2.1"}  # fmt: skip
    headers = "".join(f"{name}: {value}\r\n" for name, value in {**hostile, **wanted}.items())

    assert status(exchange(gateway, request(headers=headers))) == 200
    [seen] = [r["headers"] for r in upstream.requests]
    assert {name: seen.get(name) for name in wanted} == wanted
    assert seen["x-api-key"] == REAL_KEY and seen["host"] == upstream.url.removeprefix("http://")
    assert not ({name.lower() for name in hostile} - {"host", "x-api-key"}) & set(seen)
    assert not [value for value in seen.values() if "hostile" in value or "evil" in value or "10.9" in value]


# --- answers ---------------------------------------------------------------------------------------


def test_a_large_json_answer_is_read_for_its_usage_without_being_held_whole():
    answer = json.dumps(
        {
            "type": "message",
            "model": "claude-sonnet-4-6",
            "content": [{"type": "text", "text": 'said "usage": {"input_tokens": 9} ' + "x" * (12 << 20)}],
            "usage": {"input_tokens": 7, "output_tokens": 3, "cache_read_input_tokens": 2},
        }
    ).encode()
    call = Call("anthropic", "/v1/messages", 200)
    reader = proxy._UsageReader("anthropic", call)
    for at in range(0, len(answer), 65536):
        reader.feed(answer[at : at + 65536])
        assert len(reader.pending) <= reader.MAX_JSON
    reader.finish()

    assert (call.usage.input_tokens, call.usage.output_tokens, call.usage.cache_read_tokens) == (7, 3, 2)


def test_a_stream_is_read_as_it_comes_whatever_its_pieces():
    events = [
        {"type": "message_start", "message": {"model": "claude-sonnet-4-6", "usage": {"input_tokens": 40}}},
        {"type": "content_block_delta", "delta": {"text": "y" * 100_000}},
        {"type": "message_delta", "usage": {"output_tokens": 12}},
    ]
    stream = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()
    call = Call("anthropic", "/v1/messages", 200)
    reader = proxy._UsageReader("anthropic", call)
    for at in range(0, len(stream), 7):
        reader.feed(stream[at : at + 7])
        assert len(reader.pending) < 110_000
    reader.finish()

    assert (call.model, call.usage.input_tokens, call.usage.output_tokens) == ("claude-sonnet-4-6", 40, 12)


# --- a hostile agent through a real worker ------------------------------------------------------

ATTACKS = (Path(__file__).parents[1] / "hostile" / "gateway_attacks.py").read_text()
MARK = uuid.uuid4().hex[:10]
CAPPED = "|".join(str(held) for held in range(proxy.MAX_CONNECTIONS + 1))  # a count within the cap


def attack_task(folder: Path, slug: str, mode: str, criteria: list[dict], limits: dict | None = None) -> None:
    agent = {"type": "command", "command": ["python3", "-c", ATTACKS], "env": {"MODE": mode, "MARK": MARK}}
    task = {"task_id": slug, "initial_prompt": "attack", "agent": agent, "success_criteria": criteria}
    make_task(folder, slug, json.dumps({**task, **({"run_limits": limits} if limits else {})}))


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(300)
def test_a_hostile_agent_gets_nothing_from_the_gateway(tmp_path):
    # Every refused attack's answer is in loot.txt: none may come from the model server (the
    # mock's request ids and error texts), and the flood may hold no more than the cap.
    refused = {"type": "file_contains", "path": "loot.txt", "includes": ["attempted", "socket: found"],
               "excludes": ["req_mock_"]}  # fmt: skip
    attack_task(
        tmp_path,
        "abuse",
        "abuse",
        [
            refused,
            {"type": "file_matches_regex", "path": "loot.txt", "pattern": rf"flood: held ({CAPPED}) of"},
            {"type": "file_contains", "path": "after.txt", "includes": ["after the flood: 200"]},
        ],
    )
    attack_task(
        tmp_path,
        "burst",
        "burst",
        [refused, {"type": "file_matches_regex", "path": "loot.txt", "pattern": r"forwarded [0-2]\n"}],
        {"max_turns": 2},
    )
    import_folder_tasks(tmp_path)
    experiment = make_experiment(
        tmp_path, "experiment_id: gateway-abuse\nmax_parallel: 2\nvariants:\n  - variant_id: as-written\n"
    )
    with AnthropicMock([Turn([text("ok")])]) as api:
        purge_broker()
        worker = WorkerProcess(
            tmp_path,
            extra_env={
                "ANTHROPIC_API_KEY": REAL_KEY,
                "ANTHROPIC_BASE_URL": api.url,
                "OPENAI_API_KEY": REAL_KEY,
                "OPENAI_BASE_URL": f"{api.url}/v1",
            },  # fmt: skip
        ).start()
        try:
            run = wait_for_run(launch_run(experiment), 240, worker)
        finally:
            worker.kill()
        seen = list(api.requests)

    trials = {
        t.task_version.task.slug: t
        for t in Trial.objects.filter(run=run).select_related("task_version__task")
    }
    for slug, trial in trials.items():
        details = list(trial.criterion_results.values_list("details", flat=True))
        assert trial.status == "passed", (slug, trial.error_message, details, trial.agent_stderr[-2000:])
    assert trials["burst"].budget_exceeded == "max_turns"
    assert trials["abuse"].budget_exceeded == ""
    # What reached the model server: only whole Messages calls, without the agent's own headers.
    assert seen and all((r["method"], r["path"]) == ("POST", "/v1/messages") for r in seen), seen
    assert all(r["body"].get("messages") for r in seen)
    assert all(r["headers"].get("x-api-key") == REAL_KEY for r in seen)
    forbidden = ("x-forwarded-for", "x-forwarded-host", "forwarded", "cookie", "authorization", "x-hostile")
    assert not [r for r in seen if {name.lower() for name in r["headers"]} & set(forbidden)]
    assert not [r for r in seen if MARK in json.dumps(r["headers"])]
    assert len([r for r in seen if r["body"].get("metadata", {}).get("user_id") == f"burst-{MARK}"]) <= 2
