"""Trivial trials run one after another in this process, without Celery: where a trial's time goes.

The task is side-by-side.sh's (agent none, one `pre_run: true`, one file check). Prints the time
per trial and the median time of its one sandboxed command; with --profile, cProfile's top
functions by cumulative time.

Usage: .venv/bin/python bench/trial_profile.py [N] [--tasks] [--profile]
--tasks: N distinct tasks run once each (as side-by-side.sh runs them) instead of one task N times.
Embedded default (scratch SQLite) unless DATABASE_URL is set (then a scratch database).
"""

import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TASK = """task_id: trivial
agent: {type: none}
sandbox:
  python: null
  template_sources:
    - type: starter_files
      files: [{path: a.txt, content: "x"}]
pre_run:
  - command: "true"
    timeout: 10
success_criteria:
  - type: file_exists
    path: a.txt
"""
EXPERIMENT = "experiment_id: profile\nmax_parallel: 1\nvariants:\n  - variant_id: v\n"


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="evalsite-profile-") as tmp:
        profile_trials(int(next((a for a in sys.argv[1:] if a.isdigit()), "300")), Path(tmp))


def profile_trials(n: int, tmp_path: Path) -> None:
    if not os.environ.get("DATABASE_URL"):
        os.environ["SQLITE_PATH"] = str(tmp_path / "bench.sqlite3")
    os.environ.setdefault("BROKER_DIR", str(tmp_path / "broker"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")
    import django

    django.setup()
    from django.core.management import call_command

    from experiments_app.definitions import import_experiment, import_tasks
    from runs_app import control
    from runs_app.engine.sandbox import bubblewrap
    from runs_app.launching import LaunchOptions, launch_run
    from runs_app.models import Run

    call_command("migrate", verbosity=0)
    distinct = "--tasks" in sys.argv
    for index in range(n if distinct else 1):
        folder = tmp_path / "suite" / "tasks" / f"t{index:05}"
        folder.mkdir(parents=True)
        (folder / "task.yaml").write_text(TASK.replace("task_id: trivial", f"task_id: t{index:05}"))
    (tmp_path / "suite" / "exp.yaml").write_text(EXPERIMENT)
    import_tasks([tmp_path / "suite" / "tasks"])
    experiment = import_experiment(tmp_path / "suite" / "exp.yaml").experiment
    run = launch_run(experiment, options=LaunchOptions(repeats=1 if distinct else n, max_parallel=1))

    command_seconds = []
    run_process = bubblewrap.run_process

    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return run_process(*args, **kwargs)
        finally:
            command_seconds.append(time.perf_counter() - started)

    bubblewrap.run_process = timed
    control.CHAIN_SECONDS = float("inf")  # one execute runs the whole run, trial after trial
    profile = cProfile.Profile() if "--profile" in sys.argv else None
    started = time.perf_counter()
    if profile:
        profile.enable()
    control.execute(control.dispatch(run.pk, reserve=True), "profile:1")
    if profile:
        profile.disable()
    elapsed = time.perf_counter() - started
    run = Run.objects.get(pk=run.pk)
    print(f"{run.n_passed}/{n} passed; {1000 * elapsed / n:.1f} ms a trial (one process, no Celery)")
    print(f"its sandboxed command: median {1000 * statistics.median(command_seconds):.1f} ms")
    if profile:
        pstats.Stats(profile).sort_stats("cumulative").print_stats(40)


if __name__ == "__main__":
    main()
