"""Trial lifecycle hooks through a real worker: `hooks.trial.before` prepares the sandbox the
agent runs in, `hooks.trial.after` always runs, and a failing hook makes the trial an error that
names every failure, never a fail."""

import json

import pytest

from conftest import WorkerProcess
from experiments_app.specs.loading import load_tasks
from runs_app.launching import launch_run
from runs_app.models import Trial, TrialEvent
from runs_app.tests.engine.test_runner_worker import SLOW_AGENT, wait_for_run
from runs_app.tests.factories import import_folder_tasks, make_experiment, make_task

TASK = """
task_id: {slug}
initial_prompt: "Write out.txt once the fixture is ready"
hooks:
  trial:
    before: {before}
    after: {after}
success_criteria:
  - type: file_exists
    path: out.txt
"""
# The agent does its work only where the before hook made its fixture.
AGENT = "if test -f .fixture; then echo done > out.txt; fi"


@pytest.mark.django_db(transaction=True)
def test_hooks_run_around_each_trial_and_a_failing_one_is_an_error_with_every_message(tmp_path):
    cases = {
        "ready": ("[{command: 'echo up > .fixture'}]", "[{command: 'rm .fixture'}]"),
        "broken-fixture": (
            "[{command: 'echo no service >&2; exit 4'}, {command: 'touch never'}]",
            "[{command: 'echo cleanup failed >&2; exit 5'}]",
        ),
        "broken-cleanup": ("[{command: 'echo up > .fixture'}]", "[{command: 'exit 6'}, {command: 'true'}]"),
    }
    for slug, (before, after) in cases.items():
        make_task(tmp_path, slug, TASK.format(slug=slug, before=before, after=after))
    import_folder_tasks(tmp_path)
    experiment = make_experiment(
        tmp_path, SLOW_AGENT.format(parallel=3, repeats=1, command=json.dumps(AGENT))
    )
    worker = WorkerProcess(tmp_path).start()
    run = wait_for_run(launch_run(experiment), timeout=90, worker=worker)
    trials = {
        t.task_version.task.slug: t
        for t in Trial.objects.filter(run=run).select_related("task_version__task")
    }

    def steps(trial):
        events = TrialEvent.objects.filter(trial=trial, kind="output").order_by("seq")
        return [(e.data["step"], e.data["exit_code"]) for e in events if e.data["step"].startswith("hooks.")]

    def phases(trial):
        return list(
            TrialEvent.objects.filter(trial=trial, kind="phase").values_list("data__phase", flat=True)
        )

    ready = trials["ready"]
    assert ready.status == "passed", ready.error_message
    assert steps(ready) == [("hooks.trial.before[0]", 0), ("hooks.trial.after[0]", 0)]

    broken = trials["broken-fixture"]
    assert (broken.status, broken.error_category) == ("error", "hook")
    assert (
        "hooks.trial.before[0] `echo no service >&2; exit 4` exited with 4: no service"
        in broken.error_message
    )
    assert "then hooks.trial.after[0] `echo cleanup failed >&2; exit 5` exited with 5: cleanup failed" in (
        broken.error_message
    )
    assert "agent" not in phases(broken)  # the agent never ran on the broken fixture
    assert steps(broken) == [("hooks.trial.before[0]", 4), ("hooks.trial.after[0]", 5)]

    cleanup = trials["broken-cleanup"]
    assert (cleanup.status, cleanup.error_category) == ("error", "hook")  # it passed its criteria
    assert cleanup.error_message.startswith("hooks.trial.after[0] `exit 6` exited with 6")
    assert steps(cleanup)[-2:] == [("hooks.trial.after[0]", 6), ("hooks.trial.after[1]", 0)]  # all ran


def test_suite_hooks_are_refused_at_their_line_with_what_to_do(tmp_path):
    path = tmp_path / "task.yaml"
    text = TASK.format(slug="t", before="[]", after="[]").replace("  trial:", "  suite: {setup: x}\n  trial:")
    path.write_text(text)
    (error,) = load_tasks([path]).errors
    assert error.line == text.splitlines().index("  suite: {setup: x}") + 1
    assert (
        "hooks.suite" in str(error) and "not built yet" in str(error) and "hooks.trial.before" in str(error)
    )
