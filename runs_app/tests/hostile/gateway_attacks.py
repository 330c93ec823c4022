"""A hostile agent's attacks on its trial's model gateway, from inside the sandbox: straight at the
gateway's socket (bound into the sandbox beside the workspace) and through the forwarder (the
base URL the agent is given). Bounded: a few hundred connections and requests at most.

MODE=abuse: paths outside the API, bad framing, truncated and oversized bodies, its own headers,
CONNECT to the worker, then a flood of idle connections. MODE=burst: ten model calls at once,
under the task's `max_turns: 2`.

Writes loot.txt: the raw answer to every attack that must be refused (so a criterion can tell
whether any reached the model server), "socket: found", the flood's count and "attempted" once
all were tried; after.txt: a call made once the flood is over.
"""

import json
import os
import signal
import socket
import threading
import time
from urllib.parse import urlsplit

SOCKET = "../gateway.sock"
MESSAGES = "/anthropic/v1/messages"
FORWARDER = urlsplit(os.environ["ANTHROPIC_BASE_URL"])
MARK = os.environ.get("MARK", "")
loot = open("loot.txt", "a")  # noqa: SIM115 - written as attacks go, the agent may be stopped


def body(user: str) -> bytes:
    request = {"model": "claude-sonnet-4-6", "max_tokens": 8, "metadata": {"user_id": user},
               "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    return json.dumps(request).encode()


def connect(way: str) -> socket.socket:
    if way == "socket":
        conn = socket.socket(socket.AF_UNIX)
        conn.connect(SOCKET)
    else:
        conn = socket.create_connection((FORWARDER.hostname, FORWARDER.port))
    conn.settimeout(15)
    return conn


def exchange(way: str, raw: bytes, half_close: bool = False) -> bytes:
    """`raw` sent on a new connection; whatever came back before it closed (or broke)."""
    answer = b""
    try:
        with connect(way) as conn:
            try:
                conn.sendall(raw)
                if half_close:
                    conn.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # refused before it was all sent: the answer may still be there
            while chunk := conn.recv(65536):
                answer += chunk
                if len(answer) > 65536:
                    break
    except OSError as exc:
        answer += f"\n(connection ended: {exc})".encode()
    return answer


def head(method: str, path: str, framing: str, extra: str = "") -> bytes:
    lines = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{framing}{extra}Connection: close\r\n\r\n"
    return lines.encode()


def call(way: str, user: str, extra: str = "") -> bytes:
    """A real model call (forwarded, and counted as a turn)."""
    data = body(user)
    return exchange(way, head("POST", MESSAGES, f"Content-Length: {len(data)}\r\n", extra) + data)


def record(way: str, name: str, answer: bytes) -> None:
    loot.write(f"== {way} {name}\n{answer[:3000].decode('latin-1')}\n")
    loot.flush()


def status(answer: bytes) -> str:
    return answer.split(b"\r\n", 1)[0].decode("latin-1")


TRAVERSALS = [
    "/anthropic/../../v1/messages", "/anthropic/v1/../../../v1/messages", "/anthropic//v1/messages",
    "/anthropic/%2e%2e/%2e%2e/v1/messages", "/anthropic/v1%2f..%2f..%2fv1/messages",
    "/anthropic/%252e%252e/v1/messages", "/anthropic/v1/./messages", "/anthropic/api/oauth/profile",
    "/anthropic/v1/files", "/anthropic/v1/messages/batches", "/anthropic", "/openai/../anthropic/v1/messages",
    "/openai/v1/files", "http://127.0.0.1:5432/anthropic/v1/messages", "/anthropic/v1\\..\\..\\x",
]  # fmt: skip
FRAMINGS = {
    "negative-length": "Content-Length: -1\r\n",
    "garbage-length": "Content-Length: 12abc\r\n",
    "two-lengths": "Content-Length: 12\r\nContent-Length: 400\r\n",
    "length-and-chunked": "Content-Length: 12\r\nTransfer-Encoding: chunked\r\n",
}
HOSTILE_HEADERS = (
    f"X-Forwarded-For: 10.9.9.9\r\nX-Forwarded-Host: evil-{MARK}.test\r\nForwarded: for=10.9.9.9\r\n"
    f"Cookie: session={MARK}\r\nAuthorization: Bearer {MARK}\r\nX-Hostile: {MARK}\r\n"
)


def abuse() -> None:
    for way in ("socket", "tcp"):
        for path in TRAVERSALS:
            record(way, f"path {path}", exchange(way, head("POST", path, "Content-Length: 2\r\n") + b"{}"))
        for name, framing in FRAMINGS.items():
            record(way, name, exchange(way, head("POST", MESSAGES, framing) + body(name)[:12]))
        whole = body("truncated")
        truncated = head("POST", MESSAGES, f"Content-Length: {len(whole)}\r\n") + whole[:-20]
        record(way, "truncated", exchange(way, truncated, half_close=True))
        chunked = head("POST", MESSAGES, "Transfer-Encoding: chunked\r\n")
        unfinished = chunked + b"%x\r\n" % len(whole) + whole + b"\r\n"  # no last chunk
        record(way, "unfinished-chunked", exchange(way, unfinished, half_close=True))
        megabyte = b"100000\r\n" + b"x" * 0x100000 + b"\r\n"
        record(way, "chunked-over-the-cap", exchange(way, chunked + megabyte * 40 + b"0\r\n\r\n"))
        record(way, "connect-to-the-worker", exchange(way, b"CONNECT 127.0.0.1:5432 HTTP/1.1\r\n\r\n"))
        record(way, "connect-out", exchange(way, b"CONNECT pypi.org:443 HTTP/1.1\r\n\r\n"))
        # A real call with the agent's own headers: forwarded, so not loot (the test reads what
        # the model server saw).
        loot.write(f"== {way} own headers: {status(call(way, f'headers-{MARK}', HOSTILE_HEADERS))}\n")
    flood()


def flood() -> None:
    """Idle connections straight to the socket, past what the forwarder's process cap allows."""
    held, conns = 0, []
    try:
        for _ in range(150):
            conns.append(connect("socket"))
        for conn in conns:
            conn.settimeout(0.2)
            try:
                conn.recv(64)  # a 503, or the end: refused
            except TimeoutError:
                held += 1  # kept open, waiting for a request
        meanwhile = status(call("socket", f"flood-{MARK}"))
        loot.write(f"flood: held {held} of {len(conns)}; a call meanwhile: {meanwhile}\n")
    finally:
        for conn in conns:
            conn.close()
    time.sleep(1)
    answer = status(call("tcp", f"after-{MARK}"))
    with open("after.txt", "w") as after:
        after.write(f"after the flood: {answer.removeprefix('HTTP/1.1 ')}\n")


def burst() -> None:
    # The runner stops the agent once the budget is crossed: first write down what came back.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    barrier, answers = threading.Barrier(10), []

    def one(way: str) -> None:
        barrier.wait()
        answers.append(status(call(way, f"burst-{MARK}")))

    threads = [threading.Thread(target=one, args=("socket" if i % 2 else "tcp",)) for i in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    loot.write("".join(f"burst: {answer}\n" for answer in answers))
    loot.write(f"forwarded {sum(' 200 ' in answer for answer in answers)}\n")


try:
    with connect("socket"):
        loot.write("socket: found\n")
except OSError as exc:
    loot.write(f"socket: not reachable ({exc})\n")
abuse() if os.environ["MODE"] == "abuse" else burst()
loot.write("attempted\n")
loot.close()
