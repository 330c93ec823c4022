"""`manage.py import_coder_eval_run DIR`: coder-eval run directories become historical runs."""

import shutil
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from experiments_app.definitions import import_tasks
from experiments_app.models import Experiment, Task, Variant
from experiments_app.specs.bundles import read_bundle
from runs_app import control
from runs_app.models import CriterionResult, Run, Trial, TrialEvent

RUNS = Path(__file__).parent / "fixtures" / "coder-eval-runs"

pytestmark = pytest.mark.django_db


def import_run(directory: Path, *args: str) -> Run:
    call_command("import_coder_eval_run", str(directory), *args, stdout=None, stderr=None)
    return Run.objects.latest("pk")


def trial(run: Run, variant: str, task: str, replicate: int) -> Trial:
    return Trial.objects.get(
        run=run, variant__slug=variant, task_version__task__slug=task, replicate=replicate
    )


def nothing_imported() -> bool:
    return not (Run.objects.exists() or Experiment.objects.exists() or Task.objects.exists())


def test_it_imports_a_coder_eval_ab_run_as_a_finished_historical_run():
    run = import_run(RUNS / "ab")
    assert run.historical and run.status == Run.Status.FINISHED
    assert (run.n_trials, run.n_passed, run.n_failed, run.n_error) == (12, 9, 3, 0)
    assert run.experiment.slug == "overlay-ab"
    assert list(run.experiment.variants.values_list("slug", flat=True)) == ["baseline", "fixed-overlay"]
    assert run.config["baseline"] == "baseline" and run.config["coder_eval"]["run_id"] == "ab"
    assert run.started_at.isoformat().startswith("2026-11-30T02:46:02")
    assert run.created_at == run.started_at  # listed when it ran, not when it was imported
    failed = trial(run, "baseline", "fix-calc-agentless", 2)
    assert failed.status == Trial.Status.FAILED and failed.score == 0.25
    assert failed.setup_seconds == pytest.approx(0.0394981)
    results = list(failed.criterion_results.order_by("index"))
    assert [(r.type, r.score, r.passed, r.weight) for r in results] == [
        ("run_command", 0.0, False, 3.0),
        ("file_matches_regex", 1.0, True, 1.0),
    ]
    assert "Exit code: 1" in results[0].details["text"]
    assert trial(run, "fixed-overlay", "fix-calc-agentless", 2).status == Trial.Status.PASSED


def test_it_creates_missing_tasks_from_the_recorded_definition():
    run = import_run(RUNS / "ab")
    task = Task.objects.get(slug="noop-canary")
    # Skipped: its template files were not recorded, so no experiment may launch it as is.
    assert task.skip and task.warnings
    assert task.description and task.spec["task_id"] == "noop-canary"
    files = read_bundle(bytes(task.bundle.data))
    assert list(files) == ["noop_canary.yaml"]
    assert files["noop_canary.yaml"].decode() == task.source_yaml
    assert run.config["tasks"]["noop-canary"] == {"version": 1, "digest": task.bundle_id}
    assert trial(run, "baseline", "noop-canary", 0).task_version == task.current_version()


def test_it_reads_tokens_cost_timings_and_tool_calls():
    run = import_run(RUNS / "mab")
    assert run.experiment.slug == "model-ab" and run.n_trials == 11 == run.n_passed
    opus = trial(run, "opus", "fix-calc", 0)
    assert (opus.input_tokens, opus.output_tokens, opus.cost_usd, opus.turns) == (3000, 80, 0.017, 2)
    assert opus.agent_seconds == pytest.approx(0.953024)
    assert "Fixed add()" in opus.agent_stdout
    assert opus.variant.agent == {"type": "claude-code", "model": "claude-opus-4-6"}
    informational = opus.criterion_results.get(type="command_executed")
    assert not informational.gating and informational.weight == 0.0
    kinds = list(opus.events.values_list("kind", flat=True))
    assert kinds == ["system", "tool_call", "tool_result", "output"]
    call = opus.events.get(kind="tool_call")
    assert call.data["name"] == "Bash" and "calc.py" in call.data["input"]["command"]
    assert trial(run, "sonnet-careful", "fix-calc", 4).replicate == 4


def test_it_imports_the_report_schema_shaped_run_and_shows_it_on_the_comparison_page(member_client):
    run = import_run(RUNS / "report-schema")
    # No experiment.json: the experiment is named after the run.
    assert run.experiment.slug == "coder-eval-2026-03-14_09-30-00"
    assert (run.n_trials, run.n_passed, run.n_failed, run.n_error) == (10, 4, 3, 3)
    timeout = trial(run, "haiku", "summarize-notes", 0)
    assert timeout.status == Trial.Status.FAILED and timeout.timed_out
    assert not timeout.criterion_results.filter(passed=True).exists()  # not_evaluated never passes
    over = trial(run, "sonnet", "summarize-notes", 1)
    assert over.status == Trial.Status.FAILED and over.budget_exceeded == "tokens"
    assert trial(run, "haiku", "summarize-notes", 2).error_category == "build_failed"
    errored = trial(run, "haiku", "summarize-notes", 1)
    assert errored.status == Trial.Status.ERROR and "connection refused" in errored.error_message
    assert "ConnectionRefusedError" in errored.agent_stderr
    assert trial(run, "sonnet", "summarize-notes", 2).error_category == "not_graded"
    judge = trial(run, "sonnet", "summarize-notes", 0).criterion_results.get(type="llm_judge")
    assert judge.passed and judge.details["findings"] == ["covers all three sections", "omits the date"]
    legacy = trial(run, "sonnet", "greet-file", 1)  # `turns` key, usage with input_tokens only
    assert legacy.agent_stdout == "Done." and legacy.input_tokens == 1700 and legacy.cost_usd == 0.009
    assert legacy.config["task_id"] == "greet-file" and legacy.lineage["agent.model"] == "variant"
    weights = list(legacy.criterion_results.order_by("index").values_list("weight", flat=True))
    assert weights == [1.0, 2.0]
    # A task recorded without task_config: created from what the result says.
    assert Task.objects.get(slug="summarize-notes").description == "Summarise notes.md and label its tone"

    page = member_client.get(reverse("run_compare", args=[run.pk]))
    assert page.status_code == 200
    html = page.content.decode()
    for text in ("haiku", "sonnet", "greet-file", "summarize-notes"):
        assert text in html
    assert member_client.get(run.get_absolute_url()).status_code == 200


def test_it_attaches_the_run_to_an_existing_experiment_and_its_tasks(tmp_path):
    experiment = Experiment.objects.create(slug="overlay-ab", source_yaml="experiment_id: overlay-ab\n")
    Variant.objects.create(experiment=experiment, slug="baseline", position=0, agent={"type": "none"})
    Variant.objects.create(experiment=experiment, slug="fixed-overlay", position=1, agent={"type": "none"})
    (tmp_path / "noop.yaml").write_text(
        "task_id: noop-canary\ndescription: evalsite's own version\nagent: {type: none}\n"
        "success_criteria:\n  - type: file_exists\n    description: x\n    path: x.txt\n"
    )
    import_tasks([tmp_path])
    existing = Task.objects.get(slug="noop-canary")
    run = import_run(RUNS / "ab")
    assert run.experiment == experiment
    assert experiment.variants.count() == 2
    assert trial(run, "baseline", "noop-canary", 1).task_version == existing.current_version()
    existing.refresh_from_db()
    assert not existing.skip and existing.description == "evalsite's own version"


def test_it_refuses_variants_that_an_existing_experiment_lacks():
    experiment = Experiment.objects.create(slug="overlay-ab", source_yaml="experiment_id: overlay-ab\n")
    Variant.objects.create(experiment=experiment, slug="baseline", position=0)
    with pytest.raises(CommandError, match="has no variant.*'fixed-overlay'.*--experiment"):
        import_run(RUNS / "ab")
    assert not Run.objects.exists() and not Task.objects.exists()
    run = import_run(RUNS / "ab", "--experiment", "overlay-ab-history")
    assert run.experiment.slug == "overlay-ab-history"


def test_it_refuses_to_import_the_same_run_twice():
    first = import_run(RUNS / "mab")
    with pytest.raises(CommandError, match=f"imported already, as run {first.pk}"):
        import_run(RUNS / "mab")
    assert Run.objects.count() == 1


def test_it_names_the_missing_run_json(tmp_path):
    shutil.copytree(RUNS / "ab" / "baseline", tmp_path / "baseline")
    with pytest.raises(CommandError, match=r"run\.json: missing"):
        import_run(tmp_path)
    assert nothing_imported()


def test_it_names_the_file_line_and_problem_of_bad_json(tmp_path):
    shutil.copytree(RUNS / "ab", tmp_path / "ab")
    broken = tmp_path / "ab" / "baseline" / "noop-canary" / "01" / "task.json"
    broken.write_text('{\n  "task_id": "noop-canary",\n  "final_status": \n}\n')
    odd = tmp_path / "ab" / "fixed-overlay" / "noop-canary" / "00" / "task.json"
    odd.write_text(odd.read_text().replace('"final_status": "SUCCESS"', '"final_status": "GREAT"'))
    with pytest.raises(CommandError) as caught:
        import_run(tmp_path / "ab")
    message = str(caught.value)
    assert f"{broken}:4:1: malformed JSON" in message
    assert f"{odd}: final_status: 'GREAT' is not a coder-eval FinalStatus" in message
    assert nothing_imported()


def test_it_imports_nothing_when_a_write_fails(monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(TrialEvent.objects, "bulk_create", fail)
    with pytest.raises(RuntimeError):
        import_run(RUNS / "ab")
    assert nothing_imported() and not CriterionResult.objects.exists()


def test_it_keeps_an_imported_run_out_of_dispatch():
    run = import_run(RUNS / "ab")
    assert control.dispatch(run.pk) is None
