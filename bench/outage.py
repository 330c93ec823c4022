"""A database outage as the web sees it: how soon pages say so, and how soon they come back.

Usage: DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/outage.py
       [--outage 30] [--web-workers 2]

DATABASE_URL names the server (its database is only used to create and drop a scratch database,
`evalsite_bench_outage` or BENCH_DB_NAME). uvicorn (default settings) reaches it through a TCP
proxy on loopback, which this script cuts for `--outage` seconds (the server itself keeps
running: other users of the machine's PostgreSQL see nothing). A viewer loads the run list
back to back throughout.

Printed: the first answer after the cut (status, seconds it took), the answers during the outage
by status with their slowest, and how long after the database's return pages were served again.
"""

import argparse
import http.client
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DB_NAME = os.environ.get("BENCH_DB_NAME", "evalsite_bench_outage")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outage", type=float, default=30)
    parser.add_argument("--web-workers", type=int, default=2)
    args = parser.parse_args()
    server = os.environ.get("DATABASE_URL")
    if not server:
        sys.exit("set DATABASE_URL to a PostgreSQL server (its database is not touched)")
    import psycopg

    admin = psycopg.connect(server, autocommit=True)
    admin.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
    admin.execute(f"CREATE DATABASE {DB_NAME}")
    direct = urlunsplit(urlsplit(server)._replace(path=f"/{DB_NAME}"))
    folder = Path(tempfile.mkdtemp(prefix="outage-"))
    env = {**os.environ, "DATABASE_URL": direct, "EVALSITE_VAR_DIR": str(folder / "var"),
           "DJANGO_SETTINGS_MODULE": "evalsite.settings", "PYTHONUNBUFFERED": "1"}  # fmt: skip
    os.environ.update(env)
    python = str(ROOT / ".venv" / "bin" / "python")
    subprocess.run([python, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    cookie = login()

    from tests.outages import CutProxy, WebProcess

    proxy = CutProxy(urlsplit(server).port or 5432)
    web = WebProcess(folder, {**env, "DATABASE_URL": proxy.url(direct)}, workers=args.web_workers)
    try:
        report(args, proxy, web, cookie)
    finally:
        web.stop()
        proxy.stop()
        admin.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")


def login() -> str:
    import django

    django.setup()
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
    from django.contrib.sessions.backends.db import SessionStore

    user = get_user_model().objects.create_user("outage", password="outage-bench-pw")
    session = SessionStore()
    session[SESSION_KEY], session[BACKEND_SESSION_KEY] = (
        str(user.pk),
        "django.contrib.auth.backends.ModelBackend",
    )
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    return f"sessionid={session.session_key}"


def load(web, cookie: str) -> tuple[int, float]:
    started = time.monotonic()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", web.port, timeout=60)
        conn.request("GET", "/runs/", headers={"Cookie": cookie})
        status = conn.getresponse().status
        conn.close()
    except OSError:
        status = 0
    return status, time.monotonic() - started


def report(args, proxy, web, cookie: str) -> None:
    for _ in range(20):  # warm: every process has its pool
        load(web, cookie)
    proxy.cut()
    cut = time.monotonic()
    first = load(web, cookie)
    during: list[tuple[int, float]] = [first]
    while time.monotonic() - cut < args.outage:
        during.append(load(web, cookie))
    proxy.restore()
    back = time.monotonic()
    after: list[tuple[int, float]] = []
    while True:
        status, took = load(web, cookie)
        after.append((status, took))
        if status == 200 or time.monotonic() - back > 600:
            break
        time.sleep(0.1)
    print(f"database cut for {args.outage:g} s, uvicorn x{args.web_workers} (default settings)")
    print(f"first answer after the cut: {first[0]} in {first[1]:.2f} s")
    counts = Counter(status for status, _ in during)
    print(
        "during the outage: "
        + ", ".join(f"{n} x {status}" for status, n in sorted(counts.items()))
        + f"; slowest {max(took for _, took in during):.2f} s"
    )
    print(
        f"pages served again {time.monotonic() - back:.2f} s after the database returned ({len(after)} loads)"
    )


if __name__ == "__main__":
    main()
