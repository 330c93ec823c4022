"""A million trials on PostgreSQL: 10 runs x 100,000, then the pages and commands a team uses.

Usage: DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/million.py
       [--runs 10] [--tasks 1000] [--variants 10] [--repeats 10] [--row-kb 2] [--requests 20]

DATABASE_URL names the server: a scratch database `evalsite_bench_million` is created there and
dropped at the end (--keep keeps it, and a later call reuses it). The first run is generated as
`bench/compare_page.py` does (task difficulty x variant skill, 3% errors, a criterion a trial,
`--row-kb` KB of config, prompt, agent output and diff a trial); the others are copies of it made
in SQL, each rolled up into its unit tallies as a finished run is. Printed, against issue 13:
- the comparison page of one 100k run, p50/p95 (target p95 <= 150 ms);
- the cross-run comparison of all runs, p50/p95 (target <= 400 ms);
- `manage.py evalreport --format html` of one run: wall time and peak RSS (<= 5 s, <= 300 MB);
- the run page's trial filter (a task name substring), p50/p95 (target p95 <= 100 ms);
- the CSV of every trial of a run: rows/s (>= 50k) and the process's RSS growth (flat).
Pages are timed in process through Django's test Client (server time, no network).
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
DB_NAME = "evalsite_bench_million"
# Runs argv[1:] and prints its peak RSS (KB) as the last line of standard error.
PEAK_RSS = (
    "import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(code)"
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--variants", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--row-kb", type=int, default=2)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--keep", action="store_true")
    return parser.parse_args()


def scratch_database(server_url: str, keep: bool):
    import psycopg

    admin = psycopg.connect(server_url, autocommit=True)
    exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DB_NAME]).fetchone()
    if not (keep and exists):
        admin.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DB_NAME}")
    return urlunsplit(urlsplit(server_url)._replace(path=f"/{DB_NAME}")), admin


def copy_run(source, index: int):
    """Another finished run with the same trials (and criterion results), copied in SQL."""
    from django.db import connection, transaction

    from runs_app.analysis import rollup
    from runs_app.models import CriterionResult, Run, Trial

    with transaction.atomic():
        run = Run.objects.create(
            experiment=source.experiment, status=Run.Status.FINISHED, config=source.config,
            finished_at=source.finished_at,
        )  # fmt: skip
        columns = [f.column for f in Trial._meta.concrete_fields if f.column not in ("id", "run_id")]
        names = ", ".join(columns)
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {Trial._meta.db_table} (run_id, {names}) "
                f"SELECT %s, {names} FROM {Trial._meta.db_table} WHERE run_id = %s ORDER BY id",
                [run.pk, source.pk],
            )
            result_columns = [
                f.column for f in CriterionResult._meta.concrete_fields if f.column not in ("id", "trial_id")
            ]
            result_names = ", ".join(result_columns)
            # Trials were copied in id order: the n-th new trial is the n-th old one.
            cursor.execute(
                f"""INSERT INTO {CriterionResult._meta.db_table} (trial_id, {result_names})
                SELECT new.id, {", ".join(f"c.{c}" for c in result_columns)}
                FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM {Trial._meta.db_table}
                      WHERE run_id = %s) old
                JOIN (SELECT id, row_number() OVER (ORDER BY id) AS n FROM {Trial._meta.db_table}
                      WHERE run_id = %s) new USING (n)
                JOIN {CriterionResult._meta.db_table} c ON c.trial_id = old.id""",
                [source.pk, run.pk],
            )
        rollup.recount(run)
    return run


def timed(client, url: str, requests: int) -> tuple[float, float]:
    started = time.perf_counter()
    client.get(url)  # the first view computes what the others reuse (until the runs change)
    print(f"  first view of {url.split('?')[0]}: {(time.perf_counter() - started) * 1000:.0f} ms")
    times = []
    for _ in range(requests):
        started = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, (url, response.status_code)
    times.sort()
    return statistics.median(times), times[max(0, int(0.95 * len(times)) - 1)]


def main() -> None:
    args = parse_args()
    server = os.environ.get("DATABASE_URL")
    if not server or not server.startswith("postgres"):
        sys.exit("set DATABASE_URL to a PostgreSQL server (its own database is not touched)")
    url, admin = scratch_database(server, args.keep)
    os.environ.update({"DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "evalsite.settings"})
    os.environ.setdefault("EVALSITE_VAR_DIR", str(Path("/tmp") / "evalsite-bench-million"))
    import compare_page

    compare_page.setup_django(Path("/nonexistent"))
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.urls import reverse

    from runs_app.models import Run

    n_trials = args.tasks * args.variants * args.repeats
    runs = list(Run.objects.filter(experiment__slug=compare_page.EXPERIMENT).order_by("pk"))
    if len(runs) != args.runs or any(run.n_trials != n_trials for run in runs):
        started = time.perf_counter()
        first = compare_page.generate(args.tasks, args.variants, args.repeats, args.row_kb)
        runs = [first] + [copy_run(first, i) for i in range(1, args.runs)]
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE")
        print(f"generated {len(runs)} runs x {n_trials:,} trials in {time.perf_counter() - started:.0f} s")
    total = sum(run.n_trials for run in runs)
    print(f"history: {len(runs)} runs, {total:,} trials on PostgreSQL")

    user, _ = get_user_model().objects.get_or_create(username="bench", defaults={"is_staff": True})
    client = Client()
    client.force_login(user)
    run = runs[-1]
    p50, p95 = timed(client, reverse("run_compare", args=[run.pk]), args.requests)
    print(
        f"compare page, one {run.n_trials:,}-trial run: p50 {p50:.0f} ms, p95 {p95:.0f} ms "
        "(target p95 <= 150)"
    )
    ids = ",".join(str(r.pk) for r in runs)
    slug = run.experiment.slug
    p50, p95 = timed(client, reverse("experiment_compare", args=[slug]) + f"?runs={ids}", args.requests)
    print(f"cross-run compare, {len(runs)} runs: p50 {p50:.0f} ms, p95 {p95:.0f} ms (target <= 400)")
    p50, p95 = timed(client, reverse("run_detail", args=[run.pk]) + "?task=0421", args.requests)
    print(f"trial filter (task name substring): p50 {p50:.0f} ms, p95 {p95:.0f} ms (target p95 <= 100)")

    started = time.perf_counter()
    # Started from a small process: a child's peak RSS counts what it had before exec, and
    # this process (hundreds of MB by now) would be counted in the report's.
    report = subprocess.run(
        [sys.executable, "-c", PEAK_RSS, sys.executable, "manage.py", "evalreport", str(run.pk),
         "--format", "html", "-o", "/tmp/million.html"],
        cwd=ROOT, env=os.environ, capture_output=True, text=True,
    )  # fmt: skip
    wall = time.perf_counter() - started
    assert report.returncode == 0, report.stderr[-2000:]
    peak = int(report.stderr.strip().splitlines()[-1]) / 1024
    size = Path("/tmp/million.html").stat().st_size / 1e6
    print(
        f"evalreport --format html: {wall:.1f} s, peak RSS {peak:.0f} MB, {size:.1f} MB (targets 5 s, 300 MB)"
    )

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    started = time.perf_counter()
    response = client.get(reverse("run_compare", args=[run.pk]) + "?format=csv&table=trials")
    lines = sum(chunk.count(b"\n") for chunk in response.streaming_content)
    elapsed = time.perf_counter() - started
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"CSV of every trial: {lines - 1:,} rows in {elapsed:.1f} s = {(lines - 1) / elapsed:,.0f} rows/s "
        f"(target >= 50,000); peak RSS {rss_before:.0f} -> {rss_after:.0f} MB"
    )
    connection.close()
    if not args.keep:
        admin.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")


if __name__ == "__main__":
    main()
