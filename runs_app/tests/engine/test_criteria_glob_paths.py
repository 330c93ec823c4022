"""Glob `path`s in criteria, as coder-eval 0.12.16 reads them (`Sandbox.resolve_files`): the path
as written when it exists; else its matching files, folders and ignored folders left out; one match
is read, several or none fail the check. Scored on corpus/coder_eval_round2/spec_3_glob_paths.yaml,
against the scores coder-eval gives the same workspace:

    coder-eval evaluate spec_3_glob_paths.yaml WORKSPACE --in-place

(WORKSPACE holding the task's starter files), then through a real worker."""

from pathlib import Path

import pytest
import yaml

from conftest import wait_for
from experiments_app.definitions import import_tasks
from runs_app.engine.criteria import GradingContext, grade
from runs_app.engine.grading import glob_ignored
from runs_app.launching import LaunchOptions, launch_run
from runs_app.models import CriterionResult, Trial
from runs_app.tests.factories import make_experiment

TASK = Path(__file__).parents[3] / "experiments_app/tests/corpus/coder_eval_round2/spec_3_glob_paths.yaml"
# Each criterion's description and the score coder-eval 0.12.16 gave it.
CODER_EVAL_SCORES = {
    "exists one match": 1.0,
    "exists two matches": 1.0,
    "exists no match": 0.0,
    "exists a folder only": 0.0,
    "exists in a folder the pattern names": 1.0,
    "exists literal first": 1.0,
    "contains one match": 1.0,
    "contains two matches": 0.0,
    "contains no match": 0.0,
    "contains ignores node_modules": 1.0,
    "contains a final double star": 1.0,
    "regex one match": 1.0,
    "regex two matches": 0.0,
    "check one match": 1.0,
    "check no match": 0.0,
    "json one match, schema by glob": 1.0,
    "json two matches": 0.0,
    "label by glob": 1.0,
}


def _spec() -> dict:
    return yaml.safe_load(TASK.read_text())


def _workspace(root: Path) -> Path:
    for entry in _spec()["sandbox"]["template_sources"][0]["files"]:
        path = root / entry["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(entry["content"])
    return root


def test_each_criterion_scores_a_glob_path_as_coder_eval_does(tmp_path):
    ctx = GradingContext(workspace=_workspace(tmp_path), ignore_patterns=glob_ignored([]))

    result = grade(_spec()["success_criteria"], ctx)

    scores = {c.description: c.score for c in result.criteria}
    assert scores == CODER_EVAL_SCORES, {c.description: c.details for c in result.criteria}
    assert all(not c.error for c in result.criteria)  # a failed check, not an error
    assert result.score == pytest.approx(11 / 18)  # coder-eval: 11 of 18 passed, weights 1
    resolved = {c.description: c.details.get("resolved") for c in result.criteria}
    assert resolved["contains ignores node_modules"] == "out/report.txt"  # the file graded
    assert resolved["contains a final double star"] == "logs/run.log"
    assert resolved["contains two matches"] is None


def test_it_names_the_matches_it_would_not_guess_between(tmp_path):
    ctx = GradingContext(workspace=_workspace(tmp_path), ignore_patterns=glob_ignored([]))
    criterion = {"type": "file_contains", "path": "data/*.json", "includes": ["ok"]}

    details = grade([criterion], ctx).criteria[0].details

    assert "matches 2 files" in details["problem"] and "data/a.json, data/b.json" in details["problem"]


def test_a_task_may_take_a_folder_off_the_ignore_list(tmp_path):
    ctx = GradingContext(workspace=_workspace(tmp_path), ignore_patterns=glob_ignored(["!node_modules"]))
    criterion = {"type": "file_contains", "path": "**/report.txt", "includes": ["hello"]}

    details = grade([criterion], ctx).criteria[0].details

    assert "node_modules/pkg/report.txt, out/report.txt" in details["problem"]


@pytest.mark.django_db(transaction=True)
def test_a_worker_scores_the_glob_task_as_coder_eval_does(celery_worker_process, tmp_path):
    import_tasks([TASK])
    experiment = make_experiment(
        tmp_path, "experiment_id: globs\nvariants:\n  - {variant_id: none, agent: {type: none}}\n"
    )

    run = launch_run(experiment, options=LaunchOptions(repeats=1))
    wait_for(
        lambda: Trial.objects.get(run=run).is_final,
        timeout=60,
        message=lambda: celery_worker_process.log()[-3000:],
    )

    trial = Trial.objects.get(run=run)
    scores = {r.description: r.score for r in CriterionResult.objects.filter(trial=trial)}
    assert scores == CODER_EVAL_SCORES, trial.error_message
    assert trial.score == pytest.approx(11 / 18)
    assert trial.status == Trial.Status.FAILED


REFERENCE_TASK = TASK.parent / "spec_3_glob_reference" / "task.yaml"


def test_reference_comparison_reads_a_glob_agent_file_as_coder_eval_does(tmp_path):
    # coder-eval evaluate on the same workspace: 1.0, then 0.0 ("matches 2 files"), 0.0 (not found).
    spec = yaml.safe_load(REFERENCE_TASK.read_text())
    for entry in spec["sandbox"]["template_sources"][0]["files"]:
        (tmp_path / entry["path"]).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / entry["path"]).write_text(entry["content"])
    ctx = GradingContext(
        workspace=tmp_path, reference_dir=REFERENCE_TASK.parent / "ref", ignore_patterns=glob_ignored([])
    )

    result = grade(spec["success_criteria"], ctx)

    scores = {c.description: c.score for c in result.criteria}
    assert scores == {"one match": 1.0, "two matches": 0.0, "no match": 0.0}, [
        c.details for c in result.criteria
    ]
    assert all(not c.error for c in result.criteria)
