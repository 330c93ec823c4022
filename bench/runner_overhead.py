"""Runner overhead and throughput through a real Celery worker (2 pool processes).

Runs N trials of a trivial `command` agent (`true`) with one file check and prints:
- harness overhead per trial (median, p95): the trial's wall time minus the time spent inside
  the agent process;
- trials per second end to end (launch to last trial finished);
- the worker's peak RSS, for N=200 and N=2000 (it must not grow with N).

Usage: .venv/bin/python bench/runner_overhead.py [N ...]         (default: 200 2000)
Embedded default (scratch SQLite + filesystem broker) unless DATABASE_URL / CELERY_BROKER_URL
are set (then they must point at scratch services).
Targets on a 2-core machine: overhead median <= 30 ms; >= 20 trials/s embedded, >= 40 on Redis.
"""

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TASK = """task_id: trivial
initial_prompt: do nothing
sandbox:
  template_sources:
    - type: starter_files
      files:
        - {path: done.txt, content: "ok"}
success_criteria:
  - type: file_exists
    path: done.txt
"""
EXPERIMENT = """experiment_id: overhead
max_parallel: 16
variants:
  - variant_id: true-agent
    agent: {type: command, command: "true"}
"""


def peak_rss_mb(group: int) -> float:
    peak = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.getpgid(int(pid)) != group:
                    continue
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]))
            except (OSError, ProcessLookupError):
                continue
    return peak / 1024


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [200, 2000]
    with tempfile.TemporaryDirectory(prefix="evalsite-bench-") as tmp:
        tmp_path = Path(tmp)
        if not os.environ.get("DATABASE_URL"):
            os.environ["SQLITE_PATH"] = str(tmp_path / "bench.sqlite3")
        if not os.environ.get("CELERY_BROKER_URL"):
            os.environ["BROKER_DIR"] = str(tmp_path / "broker")
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")
        import django

        django.setup()
        from django.core.management import call_command

        from evalsite.celery import app
        from experiments_app.definitions import import_experiment, import_tasks
        from runs_app.launching import LaunchOptions, launch_run
        from runs_app.models import Run, Trial, TrialEvent

        call_command("migrate", verbosity=0)
        (tmp_path / "suite" / "tasks" / "trivial").mkdir(parents=True)
        (tmp_path / "suite" / "tasks" / "trivial" / "task.yaml").write_text(TASK)
        (tmp_path / "suite" / "exp.yaml").write_text(EXPERIMENT)
        import_tasks([tmp_path / "suite" / "tasks"])
        experiment = import_experiment(tmp_path / "suite" / "exp.yaml").experiment
        app.control.purge()
        broker = "Redis/RabbitMQ" if os.environ.get("CELERY_BROKER_URL") else "filesystem"
        database = "PostgreSQL" if os.environ.get("DATABASE_URL") else "SQLite"
        print(f"runner overhead bench: {database} + {broker} broker, 1 worker with 2 pool processes")

        for n in sizes:
            log_path = tmp_path / f"worker-{n}.log"
            with log_path.open("w") as log:
                worker = subprocess.Popen(
                    [sys.executable, "-m", "celery", "-A", "evalsite", "worker", "-c", "2",
                     "--loglevel=WARNING", "--without-gossip", "--without-mingle", "-n", f"bench-{n}@%h"],
                    cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                )  # fmt: skip
            try:
                time.sleep(3)  # let the worker connect before the clock starts
                started = time.perf_counter()
                options = LaunchOptions(repeats=n, max_parallel=16, task_slugs=["trivial"])
                run = launch_run(experiment, options=options)
                while not Run.objects.get(pk=run.pk).is_final:
                    time.sleep(0.05)
                elapsed = time.perf_counter() - started
                rss = peak_rss_mb(worker.pid)
            finally:
                os.killpg(worker.pid, 9)
                worker.wait()
            run.refresh_from_db()
            assert run.n_passed == n, f"only {run.n_passed}/{n} trials passed: see {log_path}"
            overheads = []
            process_seconds = dict(
                TrialEvent.objects.filter(trial__run=run, kind="phase", data__phase="finished").values_list(
                    "trial_id", "data__agent_process_seconds"
                )
            )
            for trial_id, duration in Trial.objects.filter(run=run).values_list("pk", "duration_seconds"):
                overheads.append((duration - (process_seconds.get(trial_id) or 0.0)) * 1000)
            overheads.sort()
            p95 = overheads[int(0.95 * (len(overheads) - 1))]
            print(
                f"N={n}: overhead median {statistics.median(overheads):.1f} ms, p95 {p95:.1f} ms; "
                f"throughput {n / elapsed:.1f} trials/s ({elapsed:.1f} s); worker peak RSS {rss:.0f} MB"
            )


if __name__ == "__main__":
    main()
