"""`manage.py evaluate`: an ended run's trials graded again with their tasks' edited criteria."""

import io
import json

import pytest
from django.core.management import CommandError, call_command

from runs_app.launching import LaunchOptions, launch_run
from runs_app.models import Trial
from runs_app.tests.factories import import_folder_tasks, make_experiment, make_task
from runs_app.tests.workers import wait_for_run

pytestmark = pytest.mark.django_db(transaction=True)

TASK = """
task_id: greet
initial_prompt: go
post_run:
  - command: echo cleaned
success_criteria:
{criteria}
"""
AGENT = (
    '{"type": "tool_call", "name": "Bash", "input": {"command": "echo hello > out.txt"}, "status": "success"}'
)


def _launch(tmp_path, keep_artifacts: bool):
    make_task(
        tmp_path, "greet", TASK.format(criteria="  - {type: file_contains, path: out.txt, includes: [bye]}")
    )
    import_folder_tasks(tmp_path)
    command = f"echo {json.dumps(AGENT)}; echo hello > out.txt"
    experiment = make_experiment(
        tmp_path,
        "experiment_id: greet\nvariants:\n  - variant_id: v\n"
        f"    agent: {{type: command, command: {json.dumps(command)}}}\n",
    )
    return launch_run(experiment, options=LaunchOptions(keep_artifacts=keep_artifacts, repeats=2))


def test_it_regrades_kept_workspaces_and_trajectories_into_new_attempts(tmp_path, celery_worker_process):
    run = wait_for_run(_launch(tmp_path, keep_artifacts=True), timeout=60, worker=celery_worker_process)
    assert run.n_failed == 2
    first = {t.pk: t for t in Trial.objects.filter(run=run)}
    # The author fixes the criterion and adds one that reads the trajectory, then re-imports.
    criteria = (
        "  - {type: file_contains, path: out.txt, includes: [hello]}\n"
        "  - {type: command_executed, command_pattern: 'echo hello'}"
    )
    make_task(tmp_path, "greet", TASK.format(criteria=criteria))
    import_folder_tasks(tmp_path)
    out = io.StringIO()

    call_command("evaluate", str(run.pk), stdout=out)

    run.refresh_from_db()
    assert (run.n_passed, run.n_failed, run.n_trials) == (2, 0, 2), out.getvalue()
    assert "re-graded 2 trial(s)" in out.getvalue() and "failed -> passed" in out.getvalue()
    for new in Trial.objects.filter(run=run, is_latest=True):
        assert new.previous_attempt_id in first and new.attempt == 2
        assert [c.passed for c in new.criterion_results.order_by("index")] == [True, True]
        assert new.input_tokens == first[new.previous_attempt_id].input_tokens
        kinds = list(new.events.values_list("kind", flat=True))
        assert "tool_call" in kinds  # the transcript came along
        texts = [e.data.get("text", "") for e in new.events.filter(kind="system")]
        assert any("re-graded by evaluate" in text for text in texts)
        steps = [e.data for e in new.events.filter(kind="output")]
        assert any(s.get("step") == "post_run[0]" and "cleaned" in s["stdout"] for s in steps)
    assert Trial.objects.filter(run=run, is_latest=False, status="failed").count() == 2  # history kept


def test_it_refuses_workspace_criteria_without_artifacts_and_writes_nothing(tmp_path, celery_worker_process):
    run = wait_for_run(_launch(tmp_path, keep_artifacts=False), timeout=60, worker=celery_worker_process)

    with pytest.raises(CommandError, match="kept no workspace.*file_contains"):
        call_command("evaluate", str(run.pk))

    assert Trial.objects.filter(run=run).count() == 2
