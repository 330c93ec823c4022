"""What tests that run trials through a real worker share: small suites, a slow agent, and
waiting for a run to end (with the worker's log when it does not)."""

import json
from pathlib import Path

from conftest import WorkerProcess, wait_for
from runs_app.models import Run, Trial
from runs_app.tests.factories import import_folder_tasks, make_experiment, make_task

SMALL_TASK = """
task_id: {slug}
initial_prompt: "Write out.txt"
sandbox:
  template_sources:
    - type: starter_files
      files:
        - {{path: README.md, content: "task {slug}"}}
success_criteria:
  - type: file_exists
    path: out.txt
"""

# An agent that takes a while, so tests can act while trials run.
SLOW_AGENT = """
experiment_id: slow
max_parallel: {parallel}
defaults:
  repeats: {repeats}
variants:
  - variant_id: slow
    agent:
      type: command
      command: {command}
"""


def wait_for_run(run: Run, timeout: float, worker: WorkerProcess | None = None) -> Run:
    def final():
        run.refresh_from_db()
        return run.is_final

    def why() -> str:
        states = list(Trial.objects.filter(run=run).values_list("pk", "status", "attempt", "dispatched_at"))
        return f"run {run.pk} to end ({run.status}); trials: {states}\nlog:\n{worker_log(worker)}"

    wait_for(final, timeout=timeout, message=why)
    return run


def worker_log(worker: WorkerProcess | None) -> str:
    return worker.log()[-5000:] if worker else ""


def small_suite(folder: Path, n_tasks: int, command: str, parallel: int = 4, repeats: int = 1):
    for i in range(n_tasks):
        make_task(folder, f"t{i}", SMALL_TASK.format(slug=f"t{i}"))
    import_folder_tasks(folder)
    return make_experiment(
        folder, SLOW_AGENT.format(parallel=parallel, repeats=repeats, command=json.dumps(command))
    )
