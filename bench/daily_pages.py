"""Time the pages of a team's daily loop: the experiment page with its launch pre-flight, the
history of 20 runs, a run's failures grouped, one unit across variants, and the API's run list
and comparison.

Usage: .venv/bin/python bench/daily_pages.py [--runs 20] [--repeats 2] [--workers 3] [--requests 20]

Builds a scratch SQLite database in a temporary folder (or DATABASE_URL when set: then it must be
a scratch database): the example tasks, the demo experiment (24 tasks × 4 variants), `--workers`
live workers, and `--runs` finished runs of it with outcomes, failing criteria and tool calls.
Then it times `--requests` GETs of each page through Django's test Client (server time: middleware,
view, template; no network) and prints the median and p95 of each.
"""

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--requests", type=int, default=20)
    return parser.parse_args()


def setup_django(folder: Path) -> None:
    if not os.environ.get("DATABASE_URL"):
        os.environ["SQLITE_PATH"] = str(folder / "bench.sqlite3")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def build(runs: int, repeats: int, workers: int):
    """The demo experiment with finished runs: pass chances by variant, a failing criterion on
    each failed trial, three tool calls on each trial of one task."""
    from django.utils import timezone

    from evalsite.versioning import code_version
    from experiments_app.definitions import import_experiment, import_tasks
    from runs_app.analysis import rollup
    from runs_app.launching import LaunchOptions, launch_run
    from runs_app.models import CriterionResult, Run, Trial, TrialEvent, Worker

    rng = random.Random(7)
    import_tasks([ROOT / "examples" / "tasks"], task_set="examples")
    demo = import_experiment(
        ROOT / "examples" / "experiments" / "demo.yaml", root=ROOT / "examples"
    ).experiment
    for i in range(workers):
        Worker.objects.create(
            name=f"bench-{i}@host-{i}", hostname=f"host-{i}", code_version=code_version(),
            agent_versions={"claude-code": "2.1.0 (Claude Code)"}, providers=["openai"],
            last_seen_at=timezone.now(),
        )  # fmt: skip
    chance = {"reference": 0.95, "no-op": 0.05, "scripted": 0.5, "claude": 0.7}
    made = []
    for _ in range(runs):
        run = launch_run(demo, options=LaunchOptions(repeats=repeats, seed=1))
        now = timezone.now()
        trials = list(run.trials.select_related("variant", "task_version__task"))
        results, events = [], []
        for trial in trials:
            passed = rng.random() < chance[trial.variant.slug]
            trial.status = "passed" if passed else "failed"
            trial.score, trial.finished_at, trial.duration_seconds = float(passed), now, rng.uniform(1, 30)
            trial.input_tokens, trial.cost_usd = rng.randint(1000, 9000), rng.uniform(0.01, 0.2)
            results.append(CriterionResult(trial=trial, index=0, type="run_command", score=float(passed),
                                           passed=passed, description="the unit tests pass"))  # fmt: skip
            if trial.task_version.task.slug == "slugify":
                for seq, command in enumerate(["ls", "cat slug.py", "pytest" if passed else "true"], 1):
                    call = {"name": "Bash", "input": {"command": command}}
                    events.append(TrialEvent(trial=trial, seq=seq, at=now, kind="tool_call", data=call))
        Trial.objects.bulk_update(
            trials, ["status", "score", "finished_at", "duration_seconds", "input_tokens", "cost_usd"]
        )
        CriterionResult.objects.bulk_create(results)
        TrialEvent.objects.bulk_create(events)
        rollup.recount(run)
        Run.objects.filter(pk=run.pk).update(status=Run.Status.FINISHED, finished_at=now)
        made.append(Run.objects.get(pk=run.pk))
    return demo, made


def time_get(client, url: str, requests: int, headers: dict | None = None) -> tuple[float, float, float]:
    """The first request's time (no comparison computed yet in this process), then the median
    and p95 of `requests` more (comparisons are kept a minute per process: `analysis.load`)."""
    from runs_app.analysis.load import forget_comparisons

    forget_comparisons()
    started = time.perf_counter()
    client.get(url, **(headers or {}))
    cold = (time.perf_counter() - started) * 1000
    samples = []
    for _ in range(requests):
        started = time.perf_counter()
        response = client.get(url, **(headers or {}))
        samples.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, (url, response.status_code)
    samples.sort()
    return cold, statistics.median(samples), samples[max(0, round(0.95 * len(samples)) - 1)]


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="evalsite-bench-daily-") as tmp:
        setup_django(Path(tmp))
        from django.contrib.auth import get_user_model
        from django.test import Client
        from django.urls import reverse

        from runs_app.tokens import create_token

        started = time.perf_counter()
        demo, runs = build(args.runs, args.repeats, args.workers)
        trials = sum(run.n_trials for run in runs)
        took = time.perf_counter() - started
        print(f"built {len(runs)} runs of {demo.slug}, {trials} trials, in {took:.1f} s")
        user = get_user_model().objects.create_user("bench", password="bench")
        client = Client()
        client.force_login(user)
        token = {"HTTP_AUTHORIZATION": f"Bearer {create_token(user, 'bench')[1]}"}
        last = runs[-1]
        pages = [
            ("experiment page (with pre-flight)", reverse("experiment_detail", args=[demo.slug]), None),
            (f"history ({len(runs)} runs)", reverse("experiment_history", args=[demo.slug]), None),
            ("a run's failures, grouped", reverse("run_failures", args=[last.pk]), None),
            ("one unit across variants", reverse("unit_view", args=[last.pk, "slugify"]), None),
            ("API: pre-flight", f"/api/experiments/{demo.slug}/preflight", token),
            ("API: list runs", "/api/runs?page_size=50", token),
            ("API: a run's comparison", f"/api/runs/{last.pk}/comparison", token),
        ]
        print(f"{'page':36} {'first ms':>9} {'median ms':>10} {'p95 ms':>8}  ({args.requests} requests)")
        for name, url, headers in pages:
            cold, median, p95 = time_get(client, url, args.requests, headers)
            print(f"{name:36} {cold:9.1f} {median:10.1f} {p95:8.1f}")


if __name__ == "__main__":
    main()
