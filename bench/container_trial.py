"""What a whole container trial costs the engine against the least any harness pays for the same
container work, in the same bench run (issue 28's target: at most 1.2 times).

1. Engine: trials of a container task (image evalsite/busybox, a template file, one `pre_run`,
   a command agent, one `run_command` criterion) run one after another in this process without
   Celery, as a worker runs them: the trial's folders and caps, its container, its four commands
   (pre_run, agent, criterion, plus the sweep of each), grading, the transcript and the database.
2. Raw: `docker run -d --network none evalsite/busybox sleep 3600`, the same three commands as
   `docker exec NAME sh -c ...`, `docker rm -f NAME`.

Blocks of K trials alternate between the two, so the machine's load weighs on both alike.
Usage: .venv/bin/python bench/container_trial.py [ROUNDS] [K]   (defaults 5 rounds of 4 trials)
Embedded default (scratch SQLite) unless DATABASE_URL is set. Root, dockerd running (make containers).
"""

import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TASK = """task_id: boxed
initial_prompt: "Write out.txt"
sandbox:
  driver: docker
  python: null
  docker: {image: evalsite/busybox}
  template_sources:
    - type: starter_files
      files: [{path: a.txt, content: "x"}]
pre_run:
  - command: "test -f a.txt"
success_criteria:
  - type: run_command
    command: "test -f out.txt"
"""
EXPERIMENT = """experiment_id: bench
max_parallel: 1
variants:
  - variant_id: v
    agent: {type: command, command: "echo done > out.txt"}
"""
COMMANDS = ["test -f a.txt || echo x > a.txt", "echo done > out.txt", "test -f out.txt"]


def main() -> None:
    numbers = [int(a) for a in sys.argv[1:] if a.isdigit()]
    rounds, block = (numbers + [5, 4])[:2] if len(numbers) < 2 else numbers[:2]
    with tempfile.TemporaryDirectory(prefix="evalsite-container-bench-", dir="/var/tmp") as tmp:
        bench(rounds, block, Path(tmp))


def bench(rounds: int, block: int, tmp: Path) -> None:
    if not os.environ.get("DATABASE_URL"):
        os.environ["SQLITE_PATH"] = str(tmp / "bench.sqlite3")
    os.environ.setdefault("BROKER_DIR", str(tmp / "broker"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.utils import timezone

    from evalsite.versioning import code_version
    from experiments_app.definitions import import_experiment, import_tasks
    from runs_app import control
    from runs_app.engine.sandbox.docker import command
    from runs_app.launching import LaunchOptions, launch_run
    from runs_app.models import Run, Worker

    call_command("migrate", verbosity=0)
    (tmp / "suite" / "tasks" / "boxed").mkdir(parents=True)
    (tmp / "suite" / "tasks" / "boxed" / "task.yaml").write_text(TASK)
    (tmp / "suite" / "exp.yaml").write_text(EXPERIMENT)
    import_tasks([tmp / "suite" / "tasks"])
    experiment = import_experiment(tmp / "suite" / "exp.yaml").experiment
    # This process plays the worker: it says it runs containers, as a worker that checked does.
    Worker.objects.create(
        name="bench@here", hostname="here", code_version=code_version(), last_seen_at=timezone.now(),
        capabilities={"containers": True, "engine": "docker"}, slots=1,
    )  # fmt: skip
    control.CHAIN_SECONDS = float("inf")
    client = command.docker_binary()
    env = command.client_env()

    def engine_block() -> float:
        run = launch_run(experiment, options=LaunchOptions(repeats=block, max_parallel=1))
        started = time.perf_counter()
        control.execute(control.dispatch(run.pk, reserve=True), "bench:1")
        elapsed = time.perf_counter() - started
        run = Run.objects.get(pk=run.pk)
        if run.n_passed != block:
            raise SystemExit(f"engine trials did not all pass: {run.n_passed}/{block}")
        return elapsed / block

    def raw_block() -> float:
        started = time.perf_counter()
        for _ in range(block):
            name = f"bench-{uuid.uuid4().hex[:8]}"
            call = lambda *args: subprocess.run([client, *args], check=True, capture_output=True, env=env)  # noqa: E731
            call("run", "-d", "--network", "none", "--name", name, "evalsite/busybox", "sleep", "3600")
            for line in COMMANDS:
                call("exec", name, "sh", "-c", line)
            call("rm", "-f", name)
        return (time.perf_counter() - started) / block

    engine_block()  # the first trial stages the runtimes and builds the helpers: not a steady cost
    engine_times, raw_times = [], []
    for _ in range(rounds):
        engine_times.append(engine_block())
        raw_times.append(raw_block())
    engine, raw = statistics.median(engine_times), statistics.median(raw_times)
    print(f"{rounds} rounds of {block} trials, interleaved")
    print(f"engine container trial: median {1000 * engine:.0f} ms a trial")
    print(f"raw docker run -d + {len(COMMANDS)} exec + rm -f: median {1000 * raw:.0f} ms a trial")
    print(f"ratio {engine / raw:.2f} (target <= 1.2)")


if __name__ == "__main__":
    main()
