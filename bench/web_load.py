"""The dashboard under a team's load: live run pages and page loads on uvicorn + PostgreSQL while
a worker runs trials.

Usage: DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/web_load.py
       [--seconds 60] [--sse 50] [--viewers 50] [--web-workers 2] [--baseline 20]

DATABASE_URL names the server (its database is only used to create and drop a scratch database,
`evalsite_bench_web` or BENCH_DB_NAME); Redis on 127.0.0.1:6379 (db 13), or BENCH_BROKER_URL, is
the broker. Everything listens on loopback, at the default settings. Steps:

1. a worker (concurrency 2) runs trials of `sleep 0.2` for `--baseline` s with no web load: the
   unloaded throughput;
2. then for `--seconds` s: `--sse` browsers hold the live stream of a second run, whose trials
   this script finishes one every 250 ms (each finish is a committed change the streams must
   push), and `--viewers` browsers load pages (home, runs, both run pages, experiments) back to
   back; the worker keeps running trials.

Printed: page loads per second, those served, those shed (503 with Retry-After: the site's
deliberate answer past its capacity) and errors (anything else: a 500, a timeout); served pages'
p50/p95; streams lost and stream latency (from just before the change's commit to the event's
arrival) p50/p95; peak database connections of the scratch database against the configured
bound; and the worker's throughput loaded vs unloaded.
"""

import argparse
import asyncio
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DB_NAME = os.environ.get("BENCH_DB_NAME", "evalsite_bench_web")
BROKER = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/13")
PASSED = re.compile(rb'data-count="passed">(\d+)<')
RETRY_AFTER = re.compile(rb"\r\nretry-after: *\d+", re.IGNORECASE)
SHED = -503


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--sse", type=int, default=50)
    parser.add_argument("--viewers", type=int, default=50)
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument("--baseline", type=float, default=20)
    parser.add_argument(
        "--pin",
        action="store_true",
        help="web processes and this script on CPU 0, the worker on CPU 1: two hosts on one machine",
    )
    parser.add_argument(
        "--think",
        type=float,
        default=1.0,
        help="mean seconds a viewer reads a page before the next (0: back to back)",
    )
    return parser.parse_args()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def scratch_database(server_url: str) -> tuple[str, object]:
    import psycopg

    admin = psycopg.connect(server_url, autocommit=True)
    admin.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
    admin.execute(f"CREATE DATABASE {DB_NAME}")
    return urlunsplit(urlsplit(server_url)._replace(path=f"/{DB_NAME}")), admin


def prepare(folder: Path) -> dict:
    """Tasks, an experiment, a user and a session; the work run (dispatched) and the streamed
    run (never dispatched: this script finishes its trials)."""
    import django

    django.setup()
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
    from django.contrib.sessions.backends.db import SessionStore
    from django.db import connection, transaction

    from experiments_app.definitions import import_experiment, import_tasks
    from runs_app.launching import LaunchOptions, launch_run
    from runs_app.models import Run

    tasks = folder / "tasks"
    for i in range(20):
        (tasks / f"t{i}").mkdir(parents=True)
        (tasks / f"t{i}" / "task.yaml").write_text(
            f"task_id: load-{i}\ninitial_prompt: go\nsandbox: {{python: null}}\n"
            "success_criteria:\n  - {type: file_exists, path: out.txt}\n"
        )
    import_tasks([tasks])
    (folder / "exp.yaml").write_text(
        "experiment_id: load\nmax_parallel: 2\ndefaults: {repeats: 200}\nvariants:\n"
        "  - variant_id: a\n    agent: {type: command, command: 'sleep 0.2; echo done > out.txt'}\n"
        "  - variant_id: b\n    agent: {type: command, command: 'sleep 0.2; echo done > out.txt'}\n"
    )
    experiment = import_experiment(folder / "exp.yaml", root=folder).experiment
    user = get_user_model().objects.create_user("load", password="load-bench-pw", is_staff=True)
    session = SessionStore()
    session[SESSION_KEY], session[BACKEND_SESSION_KEY] = (
        str(user.pk),
        "django.contrib.auth.backends.ModelBackend",
    )
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    with transaction.atomic():  # cancel_requested before dispatch runs: no worker claims these
        streamed = launch_run(experiment, options=LaunchOptions(repeats=100))
        Run.objects.filter(pk=streamed.pk).update(cancel_requested=True)
    work = launch_run(experiment, options=LaunchOptions(repeats=200))
    with connection.cursor() as cursor:
        # The planner's statistics, as autovacuum would have them on a database in use: without
        # them it expects 20 trials per run and sorts a whole run for a page of the trial table.
        cursor.execute("ANALYZE")
    return {"cookie": f"sessionid={session.session_key}", "work": work.pk, "streamed": streamed.pk}


def finished_between(run_id: int, start: float, end: float) -> int:
    from datetime import datetime

    from runs_app.models import Trial

    window = [datetime.fromtimestamp(t, tz=UTC) for t in (start, end)]
    return Trial.objects.filter(run_id=run_id, finished_at__range=window).count()


def drive(run_id: int, stop: threading.Event, commits: dict[int, float]) -> None:
    """Finish one trial of the streamed run every 250 ms; note when each change began to commit."""
    from django.db import connection
    from django.utils import timezone

    from runs_app import control
    from runs_app.models import Trial

    trial_ids = Trial.objects.filter(run_id=run_id).order_by("pk").values_list("pk", flat=True)
    for passed, trial_id in enumerate(trial_ids, start=1):
        if stop.wait(0.25):
            break
        now = timezone.now()
        Trial.objects.filter(pk=trial_id).update(status="passed", started_at=now, finished_at=now, score=1.0)
        commits[passed] = time.time()
        control.after_trial(run_id, [trial_id])  # as a worker does: recounts, publishes at commit
    connection.close()


async def request(port: int, path: str, cookie: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nCookie: {cookie}\r\nConnection: close\r\n\r\n".encode()
    )
    await writer.drain()
    data = await reader.read()
    writer.close()
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0
    return status, data


async def viewer(port: int, paths: list[str], cookie: str, until: float, results: list, think: float) -> None:
    while time.monotonic() < until:
        if think:
            await asyncio.sleep(random.uniform(0.5 * think, 1.5 * think))
        path = random.choice(paths)
        started = time.perf_counter()
        try:
            status, data = await asyncio.wait_for(request(port, path, cookie), 30)
        except (OSError, TimeoutError):
            status, data = 0, b""
        if status == 503 and RETRY_AFTER.search(data.split(b"\r\n\r\n", 1)[0]):
            status = SHED  # a deliberate 503 with Retry-After: load shed, not an error
        results.append((path, status, (time.perf_counter() - started) * 1000))


async def streamer(port: int, run_id: int, cookie: str, until: float, arrivals: list, failures: list) -> None:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as exc:
        failures.append(str(exc))
        return
    writer.write(
        f"GET /runs/{run_id}/stream/ HTTP/1.1\r\nHost: 127.0.0.1\r\nCookie: {cookie}\r\n"
        "Accept: text/event-stream\r\n\r\n".encode()
    )
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    if b" 200 " not in head.split(b"\r\n", 1)[0]:
        failures.append(head.split(b"\r\n", 1)[0].decode())
        return
    buffer = b""
    while time.monotonic() < until:
        try:
            chunk = await asyncio.wait_for(reader.read(65536), max(0.1, until - time.monotonic()))
        except TimeoutError:
            break
        if not chunk:
            failures.append("stream closed")
            break
        buffer += chunk
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            if b"event: update" in event and (match := PASSED.search(event)):
                arrivals.append((int(match.group(1)), time.time()))
    writer.close()


async def load(args, port: int, setup: dict) -> tuple[list, list, list]:
    until = time.monotonic() + args.seconds
    pages = ["/", "/runs/", f"/runs/{setup['work']}/", f"/runs/{setup['streamed']}/", "/experiments/"]
    results, arrivals, failures = [], [], []
    await asyncio.gather(
        *(
            streamer(port, setup["streamed"], setup["cookie"], until, arrivals, failures)
            for _ in range(args.sse)
        ),
        *(viewer(port, pages, setup["cookie"], until, results, args.think) for _ in range(args.viewers)),
    )
    return results, arrivals, failures


def sample_connections(admin, stop: threading.Event, peak: list) -> None:
    """The most connections to the scratch database seen at once, and who held them (each
    process names itself with PGAPPNAME)."""
    while not stop.wait(0.25):
        rows = admin.execute(
            "SELECT application_name, count(*) FROM pg_stat_activity WHERE datname = %s "
            "GROUP BY application_name",
            [DB_NAME],
        ).fetchall()
        count = sum(n for _, n in rows)
        if count > peak[0]:
            peak[0], peak[1] = count, dict(rows)


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else (values[0] if values else 0.0)


def main() -> None:
    args = parse_args()
    server = os.environ.get("DATABASE_URL")
    if not server:
        sys.exit("set DATABASE_URL to a PostgreSQL server (its database is not touched)")
    url, admin = scratch_database(server)
    folder = Path(tempfile.mkdtemp(prefix="web-load-"))
    env = {
        **os.environ, "DATABASE_URL": url, "CELERY_BROKER_URL": BROKER,
        "EVALSITE_VAR_DIR": str(folder / "var"), "DJANGO_SETTINGS_MODULE": "evalsite.settings",
        "PYTHONUNBUFFERED": "1",
    }  # fmt: skip
    os.environ.update({**env, "PGAPPNAME": "bench"})
    python = str(ROOT / ".venv" / "bin" / "python")
    subprocess.run([python, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    subprocess.run([python, "-m", "celery", "-A", "evalsite", "purge", "-f"], cwd=ROOT, env=env,
                   capture_output=True)  # fmt: skip
    setup = prepare(folder)
    port = free_port()
    processes = []
    try:
        if args.pin:
            os.sched_setaffinity(0, {0})
        worker = subprocess.Popen(
            [*pinned(args, 1), python, "-m", "celery", "-A", "evalsite", "worker", "--concurrency=2",
             "--loglevel=WARNING"],
            cwd=ROOT, env={**env, "PGAPPNAME": "worker"}, stdout=(folder / "worker.log").open("w"),
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        processes.append(worker)
        time.sleep(3 + args.baseline)  # start-up, then the unloaded window ends now
        now = time.time()
        unloaded = finished_between(setup["work"], now - args.baseline + 3, now) / (args.baseline - 3)
        web = subprocess.Popen(
            [*pinned(args, 0), str(ROOT / ".venv" / "bin" / "uvicorn"), "evalsite.asgi:application",
             "--port", str(port), "--workers", str(args.web_workers), "--no-access-log",
             "--log-level", "warning"],
            cwd=ROOT, env={**env, "PGAPPNAME": "web"}, stdout=(folder / "web.log").open("w"),
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        processes.append(web)
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        stop, peak, commits = threading.Event(), [0, {}], {}
        sampler = threading.Thread(target=sample_connections, args=(admin, stop, peak), daemon=True)
        driver = threading.Thread(target=drive, args=(setup["streamed"], stop, commits), daemon=True)
        sampler.start()
        started = time.time()
        driver.start()
        results, arrivals, failures = asyncio.run(load(args, port, setup))
        stop.set()
        driver.join(5)
        loaded = finished_between(setup["work"], started, time.time()) / (time.time() - started)
    finally:
        for process in reversed(processes):
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:  # uvicorn waits on streams still being written
                process.kill()
                process.wait()
    report(args, results, arrivals, failures, commits, peak, unloaded, loaded)
    admin.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")


def pinned(args, cpu: int) -> list[str]:
    return ["taskset", "-c", str(cpu)] if args.pin else []


def report(args, results, arrivals, failures, commits, peak, unloaded, loaded) -> None:
    from django.conf import settings

    times = [ms for _, status, ms in results if status == 200]
    errors = [(path, status) for path, status, _ in results if status not in (200, SHED)]
    shed = sum(1 for _, status, _ in results if status == SHED)
    latencies = [1000 * (at - commits[n]) for n, at in arrivals if n in commits]
    pool = settings.DATABASE_POOL_MAX_SIZE
    # each web process: its pool and its LISTEN connection; the worker: its main process, and
    # its 2 children's task thread and lease keeper each; this script: its main thread and the
    # driver (the sampler reads from another database)
    bound = args.web_workers * (pool + 1) + 5 + 2
    print(
        f"viewers {args.viewers} (think {args.think:g} s), live streams {args.sse}, {args.seconds:.0f} s, "
        f"uvicorn x{args.web_workers}" + (", web on CPU 0 and the worker on CPU 1" if args.pin else "")
    )
    print(
        f"page loads      {len(results):6d}  ({len(results) / args.seconds:.1f}/s)  served {len(times)}  "
        f"shed (503 + Retry-After) {shed} ({100 * shed / max(1, len(results)):.1f}%)  errors {len(errors)}  "
        f"served p50 {percentile(times, 50):.0f} ms  p95 {percentile(times, 95):.0f} ms"
    )
    print(
        f"stream events   {len(latencies):6d}  stream failures {len(failures)}  changes {len(commits)}  "
        f"latency p50 {percentile(latencies, 50):.0f} ms  p95 {percentile(latencies, 95):.0f} ms"
    )
    held = ", ".join(f"{name or '?'} {n}" for name, n in sorted(peak[1].items()))
    print(
        f"db connections  peak {peak[0]} ({held}), bound {bound} ({args.web_workers} web processes x "
        f"(pool {pool} + LISTEN) + worker 5 + this script 2)"
    )
    by_path: dict[str, list[float]] = {}
    for path, _, ms in results:
        by_path.setdefault(path, []).append(ms)
    print(
        "  per page p50: "
        + ", ".join(f"{p} {statistics.median(v):.0f} ms" for p, v in sorted(by_path.items()))
    )
    share = 100 * loaded / unloaded if unloaded else 0.0
    print(f"worker          {unloaded:.2f} trials/s unloaded, {loaded:.2f} loaded ({share:.0f}%)")
    if errors:
        print("errors:", sorted(set(errors))[:10])
    if failures:
        print("stream failures:", failures[:5])


if __name__ == "__main__":
    main()
