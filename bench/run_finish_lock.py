"""How long the run's row lock is held when the last trial of a 1,000-trial run finishes.

Builds a run of 50 tasks × 2 variants × 10 repeats with two gates (min_pass_rate and
no_regression, which compares the arms), marks 999 trials graded in bulk, then finishes the last
one through the runner's real path (`control.after_trial`) and times every write transaction it
opens: from the statement that takes the lock (`SELECT … FOR UPDATE` on PostgreSQL, `BEGIN
IMMEDIATE` on SQLite, which locks the database) to its COMMIT. Work done after the lock is
released (the run summary and gates) is timed apart.

Usage: .venv/bin/python bench/run_finish_lock.py [ROUNDS]        (default 5)
Scratch SQLite unless DATABASE_URL is set (then it must point at a scratch database).
"""

import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TASKS, REPEATS = 50, 10
TASK = """task_id: t{n:03d}
initial_prompt: do nothing
success_criteria:
  - type: file_exists
    path: done.txt
"""
EXPERIMENT = """experiment_id: lock-bench
max_parallel: 4
gates:
  - {type: min_pass_rate, value: 0.5}
  - {type: no_regression}
variants:
  - variant_id: base
    agent: {type: command, command: "true"}
  - variant_id: other
    agent: {type: command, command: "true"}
"""


class LockClock:
    """Times write transactions on the default connection: lock statement -> COMMIT."""

    def __init__(self, connection):
        self.connection = connection
        self.started: float | None = None
        self.holds: list[float] = []
        self._commit = connection.commit
        connection.commit = self._timed_commit

    def __call__(self, execute, sql, params, many, context):
        text = sql.upper()
        if self.started is None and ("FOR UPDATE" in text or text.startswith("BEGIN")):
            self.started = time.perf_counter()
        return execute(sql, params, many, context)

    def _timed_commit(self):
        self._commit()
        if self.started is not None:
            self.holds.append(time.perf_counter() - self.started)
            self.started = None


class Helpers:
    """The few product calls the bench makes (kept together: they follow the code's layout)."""

    def __init__(self):
        from experiments_app.definitions import import_experiment, import_tasks
        from runs_app import control
        from runs_app.launching import LaunchOptions, launch_run
        from runs_app.models import Trial

        self.import_tasks, self.import_experiment = import_tasks, import_experiment
        self.control, self.LaunchOptions, self.launch_run, self.Trial = (
            control,
            LaunchOptions,
            launch_run,
            Trial,
        )

    def import_suite(self, tasks: Path, experiment: Path):
        self.import_tasks([tasks])
        return self.import_experiment(experiment).experiment

    def launch(self, experiment, repeats: int):
        return self.launch_run(experiment, options=self.LaunchOptions(repeats=repeats))

    def trial_ids(self, run) -> list[int]:
        return list(self.Trial.objects.filter(run=run).order_by("pk").values_list("pk", flat=True))

    def grade(self, trial_ids: list[int], rng: random.Random) -> None:
        passed = [pk for pk in trial_ids if rng.random() < 0.6]
        failed = sorted(set(trial_ids) - set(passed))
        self.Trial.objects.filter(pk__in=passed).update(status="passed", score=1.0, duration_seconds=1.0)
        self.Trial.objects.filter(pk__in=failed).update(status="failed", score=0.0, duration_seconds=1.0)

    def start(self, trial_id: int) -> None:
        self.Trial.objects.filter(pk=trial_id).update(status="running")

    def finish_last(self, run, trial_id: int) -> None:
        self.Trial.objects.filter(pk=trial_id).update(status="passed", score=1.0, duration_seconds=1.0)
        self.control.after_trial(run.pk)


bench_support: Helpers


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    with tempfile.TemporaryDirectory(prefix="evalsite-bench-") as tmp:
        tmp_path = Path(tmp)
        if not os.environ.get("DATABASE_URL"):
            os.environ["SQLITE_PATH"] = str(tmp_path / "bench.sqlite3")
        os.environ["BROKER_DIR"] = str(tmp_path / "broker")
        os.environ.pop("CELERY_BROKER_URL", None)  # nothing consumes the messages: keep them local
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection

        global bench_support
        bench_support = Helpers()

        call_command("migrate", verbosity=0)
        suite = tmp_path / "suite"
        (suite / "tasks").mkdir(parents=True)
        for n in range(TASKS):
            (suite / "tasks" / f"t{n:03d}.yaml").write_text(TASK.format(n=n))
        (suite / "exp.yaml").write_text(EXPERIMENT)
        experiment = bench_support.import_suite(suite / "tasks", suite / "exp.yaml")
        database = connection.vendor
        print(f"run-finish lock bench: {database}, {TASKS} tasks × 2 variants × {REPEATS} repeats")
        holds, after = [], []
        for _ in range(rounds):
            run = bench_support.launch(experiment, REPEATS)
            trials = bench_support.trial_ids(run)
            rng = random.Random(run.pk)
            last = trials.pop()
            bench_support.grade(trials, rng)
            bench_support.start(last)
            clock = LockClock(connection)
            with connection.execute_wrapper(clock):
                started = time.perf_counter()
                bench_support.finish_last(run, last)
                total = time.perf_counter() - started
            connection.commit = clock._commit
            run.refresh_from_db()
            assert run.is_final and run.gate_results, "the run did not finish with its gates judged"
            holds.append(max(clock.holds) * 1000)
            after.append(total * 1000)
        print(
            f"longest lock hold while the last trial finishes: median {statistics.median(holds):.1f} ms "
            f"(min {min(holds):.1f}, max {max(holds):.1f}) over {rounds} runs"
        )
        print(f"whole finish (lock + summary + gates): median {statistics.median(after):.1f} ms")


if __name__ == "__main__":
    main()
