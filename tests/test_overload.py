"""Past its capacity, and without its database, the site answers 503 with Retry-After, never 500:
the ASGI admission gate, the middleware for a view's lost connection, the error handler for a
middleware's, and the pool that says at once that the database is unreachable."""

import asyncio
import socket
import time

import pytest
from django.db import OperationalError
from django.test import Client

from evalsite.overload import Admission
from evalsite.postgresql.pool import DatabaseUnreachable, Pool, PoolBusy


def _cause(error: Exception) -> OperationalError:
    """A Django error as the ORM raises it for a pool's refusal (psycopg's error wrapped)."""
    try:
        raise OperationalError(str(error)) from error
    except OperationalError as wrapped:
        return wrapped


async def _get(app, path: str) -> tuple[int, dict[bytes, bytes], bytes]:
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": path, "method": "GET", "headers": []}
    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), body


async def _slow_app(scope, receive, send):
    await asyncio.sleep(0.3)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"page"})


def test_the_gate_queues_requests_past_its_limit_and_sheds_those_that_wait_too_long():
    gate = Admission(_slow_app, limit=2, wait_seconds=0.5)

    async def burst():
        return await asyncio.gather(*(_get(gate, "/runs/") for _ in range(6)))

    started = time.monotonic()
    answers = asyncio.run(burst())
    took = time.monotonic() - started

    statuses = sorted(status for status, _, _ in answers)
    # Two at a time, 0.3 s each: the first four are served within the 0.5 s wait, two are shed.
    assert statuses == [200, 200, 200, 200, 503, 503] and took < 1.5
    shed = next(headers for status, headers, _ in answers if status == 503)
    assert shed[b"retry-after"] == b"2" and shed[b"content-type"].startswith(b"text/html")


def test_the_gate_never_holds_back_a_live_stream_or_a_static_file():
    gate = Admission(_slow_app, limit=1, wait_seconds=0.05)

    async def burst():
        paths = ["/runs/1/stream/", "/runs/1/stream/", "/static/css/evalsite.css", "/static/favicon.svg"]
        return await asyncio.gather(*(_get(gate, path) for path in paths))

    assert [status for status, _, _ in asyncio.run(burst())] == [200, 200, 200, 200]


def test_a_shed_api_request_gets_json():
    gate = Admission(_slow_app, limit=1, wait_seconds=0.05)

    async def burst():
        return await asyncio.gather(_get(gate, "/api/runs"), _get(gate, "/api/runs"))

    shed = [answer for answer in asyncio.run(burst()) if answer[0] == 503][0]
    assert shed[1][b"content-type"] == b"application/json" and b'"detail": "evalsite is busy' in shed[2]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "error, heading, retry",
    [
        (DatabaseUnreachable("the database is unreachable: connection refused"), "Database unreachable", "5"),
        (PoolBusy("all 10 pooled connections stayed busy for 5 s"), "Busy, try again in a moment", "2"),
    ],
)
def test_a_view_without_a_database_connection_answers_503_with_retry_after(
    member_client, monkeypatch, error, heading, retry
):
    from runs_app.web import runs

    def no_connection(*args, **kwargs):
        raise _cause(error)

    monkeypatch.setattr(runs, "render", no_connection)  # the page's queries run as it renders

    response = member_client.get("/runs/")

    assert response.status_code == 503 and response["Retry-After"] == retry
    assert heading in response.content.decode() and 'http-equiv="refresh"' in response.content.decode()


@pytest.mark.django_db
def test_a_middlewares_lost_connection_is_a_503_too(monkeypatch):
    from django.contrib.sessions.backends.db import SessionStore

    def no_connection(self, *args, **kwargs):
        raise _cause(DatabaseUnreachable("the database is unreachable: connection refused"))

    monkeypatch.setattr(SessionStore, "load", no_connection)
    client = Client(raise_request_exception=False)
    client.cookies["sessionid"] = "x" * 32

    response = client.get("/runs/")

    assert response.status_code == 503 and "Database unreachable" in response.content.decode()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_pool_says_at_once_that_the_database_is_unreachable_and_probes_every_second():
    port = _closed_port()
    pool = Pool(kwargs={"host": "127.0.0.1", "port": port, "dbname": "x", "connect_timeout": 2},
                min_size=1, max_size=4, timeout=10, open=False)  # fmt: skip
    pool.open(wait=False)
    try:
        started = time.monotonic()
        with pytest.raises(DatabaseUnreachable, match="unreachable"):
            pool.getconn()  # the first waiter is told when the attempt fails, not after 10 s
        first = time.monotonic() - started
        started = time.monotonic()
        for _ in range(20):
            with pytest.raises(DatabaseUnreachable):
                pool.getconn()
        refusals = time.monotonic() - started
    finally:
        pool.close()

    # Bounds well under the pool's 10 s wait, with room for a loaded machine.
    assert first < 5, first
    assert refusals < 5, refusals  # one probe a second at most; the others refused at once
    assert pool.down_since is not None and "Connection refused" in pool.down_reason


def test_a_stream_rides_out_a_check_that_finds_no_connection():
    from runs_app.web import stream

    class Busy:
        done = False
        calls = 0

        def step(self) -> bytes:
            self.calls += 1
            if self.calls == 1:
                raise _cause(PoolBusy("all 10 pooled connections stayed busy for 5 s"))
            return b"event: update\ndata: x\n\n"

    busy = Busy()
    assert stream._checked(busy) == b"" and not busy.done  # nothing sent, the stream goes on
    assert stream._checked(busy).startswith(b"event: update")  # the next check sends
