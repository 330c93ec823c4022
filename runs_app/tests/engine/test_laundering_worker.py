"""Through a real worker: two variants run the same agent on the same tasks; one of them also
plants every trick that once laundered a fail into an infrastructure error. Both must get the
same verdicts, none an error, and the planted tricks must be named in the failing criteria."""

import io
import json
import shutil
import tarfile
from collections import Counter
from pathlib import Path

import pytest
from django.core.files.storage import default_storage

from conftest import WorkerProcess, purge_broker
from runs_app.launching import LaunchOptions, launch_run
from runs_app.models import CriterionResult, Trial
from runs_app.tests.factories import import_folder_tasks, make_experiment, make_task
from runs_app.tests.workers import wait_for_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

AGENT = Path(__file__).parents[1] / "hostile" / "launder.py"
CRITERIA = {
    "exists": "{type: file_exists, path: out.txt}\n"
    "  - {type: file_matches_regex, path: out.txt, pattern: 'do+ne'}",
    "loop": "{type: file_contains, path: answer.txt, includes: ['42']}",
    "json": "{type: json_check, path: result.json, assertions: [{expression: value, expected: 1}]}",
    "special": "{type: file_matches_regex, path: report.txt, pattern: ok}\n"
    "  - {type: file_contains, path: sock.txt, includes: [ok]}",
    "outside": "{type: file_contains, path: data.txt, includes: [x]}\n"
    "  - {type: file_contains, path: big.txt, includes: [done]}",
    "command": "{type: run_command, command: python3 solution.py, expected_stdout: ok}",
}
# What the hostile variant's failing criteria must say they found, per task.
FOUND = {
    "loop": ["'answer.txt' is a loop of symbolic links"],
    "json": ["'result.json' nests arrays or objects too deeply to parse"],
    "special": ["'report.txt' is a FIFO (named pipe)", "'sock.txt' is a socket"],
    "outside": ["'data.txt' resolves outside its folder (to /dev/zero)", "'big.txt' is 17825792 bytes"],
    "command": ['"exit_code": 139', "not text"],
}
EXPERIMENT = """
experiment_id: laundering
max_parallel: 4
defaults:
  repeats: 2
variants:
  - variant_id: honest
    agent: {type: command, command: "python3 {script}", script: launder.py}
  - variant_id: hostile
    agent: {type: command, command: "python3 {script} --plant", script: launder.py}
"""


def test_planted_tricks_fail_like_the_honest_agent_and_are_never_errors(tmp_path):
    for slug, criteria in CRITERIA.items():
        make_task(tmp_path, slug, f"task_id: {slug}\ninitial_prompt: go\nsuccess_criteria:\n  - {criteria}\n")
    import_folder_tasks(tmp_path)
    (tmp_path / "experiments").mkdir()
    shutil.copy(AGENT, tmp_path / "experiments" / "launder.py")
    experiment = make_experiment(tmp_path, EXPERIMENT)
    purge_broker()
    worker = WorkerProcess(tmp_path).start()
    try:
        run = wait_for_run(launch_run(experiment, options=LaunchOptions(keep_artifacts=True)), 240, worker)
    finally:
        worker.kill()

    trials = list(Trial.objects.filter(run=run).select_related("variant", "task_version__task"))
    errors = [(t.variant.slug, t.task_version.task.slug, t.error_category, t.error_message) for t in trials]
    assert not [error for error in errors if error[2]], errors
    counts = {
        variant: Counter(t.status for t in trials if t.variant.slug == variant)
        for variant in ("honest", "hostile")
    }
    assert counts["honest"] == counts["hostile"] == {"passed": 2, "failed": 10}, counts  # the same pass rate
    verdicts = Counter((t.variant.slug, t.task_version.task.slug, t.status) for t in trials)
    for slug in CRITERIA:
        expected = "passed" if slug == "exists" else "failed"
        assert verdicts[("honest", slug, expected)] == verdicts[("hostile", slug, expected)] == 2, verdicts

    hostile = [t for t in trials if t.variant.slug == "hostile"]
    for trial in hostile:
        details = " ".join(
            json.dumps(result.details) for result in CriterionResult.objects.filter(trial=trial, passed=False)
        )
        for words in FOUND.get(trial.task_version.task.slug, []):
            assert words in details, (trial.task_version.task.slug, details)
        assert "tricks/caf\\xe9-\\xff.txt" in trial.diff and "tricks/line\\nbreak" in trial.diff
        with (
            default_storage.open(trial.artifact) as handle,
            tarfile.open(fileobj=io.BytesIO(handle.read())) as tar,
        ):
            names = set(tar.getnames())
        assert "workspace/tricks/text.txt" in names and "workspace/tricks/pipe" not in names
