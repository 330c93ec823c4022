"""`manage.py export_coder_eval_run`: a run written as a coder-eval run directory reads back
through the importer with the same outcomes, scores and tokens."""

import io
import json
import subprocess

import pytest
from django.core.management import CommandError, call_command

from runs_app.importers.coder_eval import import_coder_eval_run
from runs_app.launching import launch_run
from runs_app.models import Trial
from runs_app.tests.factories import import_folder_tasks, make_experiment, make_task
from runs_app.tests.workers import wait_for_run

pytestmark = pytest.mark.django_db(transaction=True)

USAGE = '{"type": "usage", "input_tokens": 120, "output_tokens": 30, "cost_usd": 0.002}'
CALL = '{"type": "tool_call", "name": "Bash", "input": {"command": "echo hi > out.txt"}, "status": "success"}'


def exported_run(tmp_path, worker):
    make_task(
        tmp_path,
        "writes",
        "task_id: writes\ninitial_prompt: go\nsuccess_criteria:\n"
        "  - {type: file_exists, path: out.txt}\n  - {type: command_executed, command_pattern: echo}\n",
    )
    make_task(
        tmp_path,
        "rows",
        "task_id: rows\ninitial_prompt: 'say ${row.word}'\n"
        "dataset: {rows: [{id: a, word: hi}, {id: b, word: bye}]}\n"
        "success_criteria:\n  - {type: file_contains, path: out.txt, includes: ['${row.word}'],"
        " suite_thresholds: {mean: 0.5}}\n",
    )
    import_folder_tasks(tmp_path)
    good = json.dumps(f"echo {json.dumps(USAGE)}; echo {json.dumps(CALL)}; echo hi > out.txt")
    experiment = make_experiment(
        tmp_path,
        "experiment_id: exported\ndefaults: {repeats: 2}\nvariants:\n"
        f"  - variant_id: good\n    agent: {{type: command, command: {good}}}\n"
        "  - variant_id: idle\n    agent: {type: command, command: 'true'}\n",
    )
    return wait_for_run(launch_run(experiment), timeout=90, worker=worker)


def test_an_exported_run_reads_back_with_the_same_outcomes(tmp_path, celery_worker_process):
    run = exported_run(tmp_path, celery_worker_process)
    target = tmp_path / "exported"
    out = io.StringIO()

    call_command("export_coder_eval_run", str(run.pk), str(target), stdout=out)

    assert "wrote 12 trial(s)" in out.getvalue()
    summary = json.loads((target / "run.json").read_text())
    assert (summary["tasks_run"], summary["tasks_succeeded"]) == (12, run.n_passed)
    document = json.loads((target / "good/rows/a/01/task.json").read_text())
    assert document["task_id"] == "rows/a" and document["final_status"] == "SUCCESS"
    assert document["iterations"][0]["user_input"] == "say hi"
    assert json.loads((target / "good/rows/b/01/task.json").read_text())["final_status"] == "FAILURE"
    writes = json.loads((target / "good/writes/00/task.json").read_text())
    assert writes["iterations"][0]["commands"][0]["parameters"] == {"command": "echo hi > out.txt"}

    report = import_coder_eval_run(target, experiment_slug="exported-back")

    key = lambda t: (t.variant.slug, t.task_version.task.slug, t.dataset_row_id, t.replicate)  # noqa: E731
    fields = lambda t: (t.status, t.score, t.input_tokens, t.output_tokens, round(t.cost_usd, 6))  # noqa: E731
    original = {
        key(t): fields(t)
        for t in Trial.objects.filter(run=run).select_related("variant", "task_version__task")
    }
    back = {
        key(t): fields(t)
        for t in Trial.objects.filter(run=report.run).select_related("variant", "task_version__task")
    }
    assert back == original
    # the dataset suite's thresholds came along and are judged the same way (good: 1 of 2 rows)
    assert report.run.suite_results == run.suite_results
    assert {(s["variant"], s["passed"]) for s in report.run.suite_results} == {
        ("good", True),
        ("idle", False),
    }
    assert {s for s, *_ in original.values()} == {"passed", "failed"}


def test_it_refuses_a_folder_that_is_not_empty(tmp_path, celery_worker_process):
    run = exported_run(tmp_path, celery_worker_process)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    with pytest.raises(CommandError, match="not empty"):
        call_command("export_coder_eval_run", str(run.pk), str(tmp_path / "busy"))


FORBIDDEN = "{type: command_executed, command_pattern: 'rm -rf', min_count: 0, max_count: 0, stop_early: {}}"
RM_CALL = '{"type": "tool_call", "name": "Bash", "input": {"command": "rm -rf build"}, "status": "success"}'


def stopped_and_suite_run(tmp_path, worker):
    """A trial stopped early (a forbidden command) and a dataset suite whose threshold fails."""
    make_task(
        tmp_path,
        "stops",
        "task_id: stops\ninitial_prompt: go\nrun_limits: {max_turns: 5}\nsuccess_criteria:\n"
        f"  - {FORBIDDEN}\n  - {{type: file_exists, path: out.txt, description: the output}}\n",
    )
    make_task(
        tmp_path,
        "rows",
        "task_id: rows\ninitial_prompt: 'say ${row.word}'\n"
        "dataset: {rows: [{id: a, word: hi}, {id: b, word: bye}]}\n"
        "success_criteria:\n  - {type: file_contains, path: out.txt, includes: ['${row.word}'],"
        " suite_thresholds: {mean: 0.9}}\n",
    )
    import_folder_tasks(tmp_path)
    agent = json.dumps(
        f"echo {json.dumps(RM_CALL)}; sleep 0.3; echo {json.dumps(CALL)}; echo hi > out.txt; sleep 3"
    )
    experiment = make_experiment(
        tmp_path,
        "experiment_id: stopped\nmax_parallel: 3\nvariants:\n"
        f"  - variant_id: v\n    agent: {{type: command, command: {agent}}}\n",
    )
    return wait_for_run(launch_run(experiment), timeout=90, worker=worker)


def test_coder_eval_report_reads_every_exported_trial_with_the_stop_and_the_suite(
    tmp_path, celery_worker_process
):
    from runs_app.tests.coder_eval_cli import coder_eval_python, run_coder_eval

    run = stopped_and_suite_run(tmp_path, celery_worker_process)
    statuses = {
        (t.task_version.task.slug, t.dataset_row_id): (t.status, t.stopped_early)
        for t in run.trials.select_related("task_version__task")
    }
    assert statuses == {
        ("stops", ""): ("failed", "criterion_failed"),
        ("rows", "a"): ("passed", ""),
        ("rows", "b"): ("failed", ""),
    }
    target = tmp_path / "exported"
    call_command("export_coder_eval_run", str(run.pk), str(target), stdout=io.StringIO())

    stop = json.loads((target / "v/stops/00/task.json").read_text())["early_stop"]
    assert stop["reason"] == "criterion_failed" and stop["tool_call_index"] == 1
    assert stop["deciding_criterion_type"] == "command_executed"
    assert stop["armed_criteria"] == ["command_executed: " + stop["deciding_criterion_description"]]
    assert stop["turns_remaining_at_stop"] is not None and stop["gate_threshold"] == 1.0
    suite = json.loads((target / "v/rows/suite.json").read_text())
    assert (suite["rows_total"], suite["rows_passed"], suite["rows_failed"], suite["passed"]) == (
        2,
        1,
        1,
        False,
    )
    assert suite["criterion_stats"] == [
        {"criterion_type": "file_contains", "rows_evaluated": 2, "average_score": 0.5, "error_count": 0}
    ]
    [sample] = suite["failed_samples"]
    assert (sample["task_id"], sample["task_json_relpath"]) == ("rows/b", "v/rows/b/00/task.json")
    # coder-eval's own SuiteRollup model takes it as written
    check = (
        "import sys; from coder_eval.models.results import SuiteRollup; "
        "r = SuiteRollup.model_validate_json(open(sys.argv[1]).read()); print(r.rows_graded, r.passed)"
    )
    done = subprocess.run(
        [str(coder_eval_python()), "-c", check, str(target / "v/rows/suite.json")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.stdout.strip() == "2 False", done.stderr
    [aggregate] = suite["criterion_aggregates"]
    assert aggregate["threshold_checks"][0] == {
        "metric": "mean",
        "min_value": 0.9,
        "actual_value": 0.5,
        "passed": False,
    }

    # Every task.json loads as coder-eval's EvaluationResult (html renders each one, skipping none).
    html = run_coder_eval("report", str(target), "--format", "html")
    assert html.returncode == 0 and "Skipping" not in html.stdout, html.stdout + html.stderr
    assert "Generated 3 HTML report(s)" in html.stdout
    # The suite gate is read from suite.json (junit's synthetic suite-gates testsuite).
    junit = run_coder_eval("report", str(target), "--format", "junit")
    assert junit.returncode == 0, junit.stdout + junit.stderr
    xml = (target / "junit.xml").read_text()
    assert "suite-gates" in xml and "rows" in xml, xml
    markdown = run_coder_eval("report", str(target))
    assert markdown.returncode == 0, markdown.stdout + markdown.stderr
    # --rebuild re-aggregates run.json from the task.json files: every trial counted, same outcome.
    before = json.loads((target / "run.json").read_text())
    rebuilt = run_coder_eval("report", str(target), "--rebuild")
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    assert "Aggregated 3 task(s) (1 ok / 2 fail / 0 err)" in rebuilt.stdout, rebuilt.stdout
    after = json.loads((target / "run.json").read_text())
    assert (after["tasks_run"], after["tasks_succeeded"], after["tasks_failed"]) == (
        before["tasks_run"],
        before["tasks_succeeded"],
        before["tasks_failed"],
    )
    scores = lambda summary: sorted((r["task_id"], r["weighted_score"]) for r in summary["task_results"])  # noqa: E731
    assert scores(after) == scores(before)
