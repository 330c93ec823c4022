"""Time the comparison page on a run of 100,000 trials, and the run page's per-update cost.

Usage: .venv/bin/python bench/compare_page.py [--tasks 1000] [--variants 10] [--repeats 10]
       [--requests 20] [--row-kb 8] [--sqlite PATH]

Generates the run with bulk_create straight into a scratch database: a SQLite file in a temporary
folder (or PATH with --sqlite, kept and reused on the next call), or DATABASE_URL when set — then
it must be a scratch database; the script only deletes what it created before (experiment
`bench-compare`, tasks `bench-cmp-*`). It then times `requests` GETs of the comparison page through
Django's test Client (server time: middleware, view, template; no network) and prints median and
p95 against the 500 ms target, then the cost of one live update of the run page.

Trials carry `--row-kb` KB of resolved config, lineage, prompt, agent output and diff, as real
ones do: SQLite reads through a row's earlier columns to reach the small ones the comparison
sums, so lean rows would flatter it (the covering index trial_comparison_idx is what keeps the
comparison off the wide rows).
"""

import argparse
import hashlib
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

EXPERIMENT = "bench-compare"
TASK_PREFIX = "bench-cmp-"
TARGET_MS = 500


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--variants", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--row-kb", type=int, default=8, help="KB of text per trial (0: lean rows)")
    parser.add_argument("--sqlite", type=Path, help="keep the SQLite file here and reuse it")
    return parser.parse_args()


def setup_django(sqlite_path: Path) -> None:
    if not os.environ.get("DATABASE_URL"):
        os.environ["SQLITE_PATH"] = str(sqlite_path)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def existing_run(n_trials: int, row_kb: int):
    from runs_app.models import Run

    run = Run.objects.filter(experiment__slug=EXPERIMENT).order_by("-pk").first()
    if run is None or run.n_trials != n_trials or run.config.get("bench_row_kb") != row_kb:
        return None
    return run


def analyze() -> None:
    from django.db import connection

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            # Index-only scans need the visibility map autovacuum keeps.
            cursor.execute("VACUUM ANALYZE runs_app_trial")


def delete_previous() -> None:
    from experiments_app.models import Bundle, Experiment, Task
    from runs_app.models import Run, Trial

    Trial.objects.filter(run__experiment__slug=EXPERIMENT).delete()
    Run.objects.filter(experiment__slug=EXPERIMENT).delete()
    Experiment.objects.filter(slug=EXPERIMENT).delete()
    Task.objects.filter(slug__startswith=TASK_PREFIX).delete()
    Bundle.objects.filter(digest__startswith="bench").delete()


def generate(tasks: int, variants: int, repeats: int, row_kb: int):
    """One finished run: task difficulty and variant skill set each trial's pass chance."""
    from django.db import connection, transaction
    from django.utils import timezone

    from experiments_app.models import Bundle, Experiment, Task, TaskVersion, Variant
    from runs_app.models import Run, Trial

    rng = random.Random(7)
    with transaction.atomic():
        delete_previous()
        bundles = Bundle.objects.bulk_create(
            [Bundle(digest=f"bench{i:059d}", data=b"", size=0) for i in range(tasks)]
        )
        task_rows = Task.objects.bulk_create(
            [
                Task(
                    slug=f"{TASK_PREFIX}{i:04d}",
                    tags=["bench", f"bucket-{i % 10}"],
                    source_yaml="",
                    bundle=bundle,
                )
                for i, bundle in enumerate(bundles)
            ]
        )
        versions = TaskVersion.objects.bulk_create(
            [
                TaskVersion(
                    task=task,
                    number=1,
                    spec={},
                    source_yaml="",
                    yaml_path="task.yaml",
                    bundle_id=task.bundle_id,
                )
                for task in task_rows
            ]
        )
        experiment = Experiment.objects.create(slug=EXPERIMENT, repeats=repeats)
        arms = Variant.objects.bulk_create(
            [Variant(experiment=experiment, slug=f"v{j:02d}", position=j) for j in range(variants)]
        )
        run = Run.objects.create(
            experiment=experiment,
            status=Run.Status.FINISHED,
            config={"baseline": arms[0].slug, "bench_row_kb": row_kb},
            finished_at=timezone.now(),
        )
        now = timezone.now()
        skills = [rng.uniform(-0.5, 1.0) for _ in arms]
        payloads = [_payload(rng, row_kb) for _ in range(64)]
        trials = []
        for version in versions:
            difficulty = rng.gauss(0.0, 1.5)
            for arm, skill in zip(arms, skills, strict=True):
                fingerprint = hashlib.sha256(f"{version.pk}/{arm.pk}".encode()).hexdigest()
                for replicate in range(repeats):
                    trial = _trial(rng, run, version, arm, replicate, skill - difficulty, fingerprint, now)
                    for name, value in rng.choice(payloads).items():
                        setattr(trial, name, value)
                    trials.append(trial)
            if len(trials) >= 10_000:
                Trial.objects.bulk_create(trials, batch_size=1000)
                trials = []
        Trial.objects.bulk_create(trials, batch_size=1000)
        run.refresh_counts()
    if connection.vendor == "postgresql":
        # What autovacuum does within a minute of a bulk load: without statistics the planner
        # takes 100,000 rows for 23 and sorts on disk.
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    return run


def _payload(rng: random.Random, row_kb: int) -> dict:
    """Random text in a real trial's proportions: config 30%, lineage 5%, prompt 10%, agent
    output 40%, diff 15%. A few dozen are shared by all trials to keep generation quick."""

    def text(share: float) -> str:
        return rng.randbytes(int(row_kb * 1024 * share) // 2).hex()

    return {
        "config": {"agent": {"type": "claude-code"}, "initial_prompt": text(0.3)},
        "lineage": {"agent.type": text(0.05)},
        "prompt": text(0.1),
        "agent_stdout": text(0.4),
        "diff": text(0.15),
    }


def _trial(rng, run, version, variant, replicate, logit, fingerprint, now):
    from runs_app.models import Trial

    roll = rng.random()
    if roll < 0.03:
        status = Trial.Status.ERROR
    else:
        passed = rng.random() < 1 / (1 + 2.718281828**-logit)
        status = Trial.Status.PASSED if passed else Trial.Status.FAILED
    return Trial(
        run=run,
        task_version=version,
        variant=variant,
        replicate=replicate,
        status=status,
        config={},
        config_fingerprint=fingerprint,
        score=None
        if status == Trial.Status.ERROR
        else (1.0 if status == Trial.Status.PASSED else rng.random()),
        finished_at=now,
        duration_seconds=rng.lognormvariate(3, 0.5),
        input_tokens=rng.randrange(1000, 50000),
        output_tokens=rng.randrange(100, 5000),
        cost_usd=rng.uniform(0.001, 0.2),
    )


def time_requests(url: str, count: int, cpu: list[float] | None = None) -> list[float]:
    from django.contrib.auth import get_user_model
    from django.test import Client

    user, _ = get_user_model().objects.get_or_create(username="bench-compare")
    client = Client()
    client.force_login(user)

    def get() -> None:
        response = client.get(url)
        assert response.status_code == 200, f"GET {url}: {response.status_code}"

    return _timed(get, count, cpu)


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def time_update(run) -> list[str]:
    """Per-update cost of the run page's live stream: one call of the function the stream runs
    each tick, runs_app.web.stream.run_stream_update, forced to render (no previous state), and
    one tick where nothing changed."""
    from django.contrib.auth import get_user_model
    from django.test import RequestFactory

    from runs_app.web.stream import run_stream_update as update

    user = get_user_model().objects.get(username="bench-compare")
    request = RequestFactory().get(f"/runs/{run.pk}/stream/")
    request.user = user
    _, state = update(run.pk, None, {}, request)
    rendered = _timed(lambda: update(run.pk, None, {}, request))
    unchanged = _timed(lambda: update(run.pk, state, {}, request))
    return [
        f"run page stream, one update (run_stream_update rendering its fragments): {_stats(rendered)}",
        f"run page stream, one tick with nothing new (run_stream_update): {_stats(unchanged)}",
    ]


def _timed(call, count: int = 20, cpu: list[float] | None = None) -> list[float]:
    """Wall-clock milliseconds of each call; with `cpu`, also this process's CPU milliseconds
    (with SQLite that is the whole cost, and other processes' load does not inflate it)."""
    timings = []
    for _ in range(count):
        started, started_cpu = time.perf_counter(), time.process_time()
        call()
        timings.append((time.perf_counter() - started) * 1000)
        if cpu is not None:
            cpu.append((time.process_time() - started_cpu) * 1000)
    return timings


def _stats(timings: list[float]) -> str:
    return f"median {statistics.median(timings):.1f} ms, p95 {p95(timings):.1f} ms"


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="evalsite-bench-") as tmp:
        setup_django(args.sqlite or Path(tmp) / "bench.sqlite3")
        from django.db import connection
        from django.urls import reverse

        n_trials = args.tasks * args.variants * args.repeats
        run = existing_run(n_trials, args.row_kb)
        if run is None:
            started = time.perf_counter()
            run = generate(args.tasks, args.variants, args.repeats, args.row_kb)
            print(
                f"generated {n_trials} trials of ~{args.row_kb} KB in {time.perf_counter() - started:.1f} s"
            )
        analyze()
        url = reverse("run_compare", args=[run.pk])
        time_requests(url, 1)  # warm-up: imports, template compilation, database caches
        cpu: list[float] = []
        timings = time_requests(url, args.requests, cpu)
        backend = "PostgreSQL" if connection.vendor == "postgresql" else "SQLite"
        verdict = "ok" if p95(timings) <= TARGET_MS else "OVER TARGET"
        load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
        print(f"machine: {os.cpu_count()} CPUs, load average {load} (other work slows every figure below)")
        print(
            f"comparison page, {n_trials} trials ({args.variants} variants x {args.tasks} tasks x "
            f"{args.repeats} repeats, ~{args.row_kb} KB rows, {backend}), "
            f"{args.requests} requests: median "
            f"{statistics.median(timings):.0f} ms, p95 {p95(timings):.0f} ms "
            f"(target p95 <= {TARGET_MS} ms: {verdict})"
        )
        print(f"comparison page, CPU time of the web process: median {statistics.median(cpu):.0f} ms")
        for line in time_update(run):
            print(line)


if __name__ == "__main__":
    main()
