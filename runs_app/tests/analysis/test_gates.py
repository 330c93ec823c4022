"""Gates: spec validation, judging (pure) and the verdict stored when a run ends."""

import textwrap

import pytest
from django.conf import settings
from pydantic import ValidationError

from experiments_app.definitions import ImportFailed, import_experiment, import_tasks
from experiments_app.specs import ExperimentSpec
from runs_app import control
from runs_app.analysis.stats.gates import (
    RunFacts,
    VariantFacts,
    VersusFacts,
    all_passed,
    evaluate_gates,
    validate_gates,
)
from runs_app.launching import LaunchOptions, launch_run
from runs_app.models import Run, Trial

EXAMPLES = settings.BASE_DIR / "examples"


def facts(
    *variants: VariantFacts,
    baseline: str = "base",
    suites: list[dict] | None = None,
    overall: VariantFacts | None = None,
) -> RunFacts:
    return RunFacts(list(variants), baseline, suites or [], overall, "95% cluster-robust t")


def judge(gate: dict, run: RunFacts) -> dict:
    (result,) = evaluate_gates(validate_gates([gate]), run)
    return result


def versus(
    delta: float,
    low: float,
    high: float,
    p: float | None = 0.01,
    clusters: int = 30,
    untested: str = "",
    detectable: float | None = 0.04,
    low_if_errors_fail: float | None = None,
):
    return VersusFacts(
        clusters, 0.7, 0.7 + delta, delta, low, high, p, untested, low_if_errors_fail, detectable
    )


BASE = VariantFacts("base", passed=8, failed=2, rate=0.8, low=0.62, high=0.91)
NEW = VariantFacts(
    "new", passed=5, failed=4, errors=1, rate=5 / 9, low=0.3, high=0.78, versus=versus(-0.3, -0.5, -0.1)
)


def test_min_pass_rate_needs_the_lower_bound_to_reach_the_value_by_default():
    result = judge({"type": "min_pass_rate", "value": 0.6}, facts(BASE, NEW))

    assert result["passed"] is False
    assert "base: 80.0% [62.0%, 91.0%]: its lower bound 62.0% reaches 60.0%" in result["detail"]
    assert "new: 55.6% [30.0%, 78.0%]: its lower bound 30.0% is below 60.0%" in result["detail"]
    assert result["name"] == "min_pass_rate >= 60% (each variant, lower bound)"
    assert "(95% cluster-robust t)" in result["detail"]
    # 80% estimated, but the interval reaches down to 62%: not shown to reach 70%.
    assert judge({"type": "min_pass_rate", "value": 0.7, "variant": "base"}, facts(BASE))["passed"] is False


def test_min_pass_rate_may_judge_the_estimate_or_every_variant_together():
    run = facts(BASE, NEW, overall=VariantFacts("overall", 13, 6, 1, rate=0.684, low=0.5, high=0.8))

    estimate = judge({"type": "min_pass_rate", "value": 0.7, "variant": "base", "use": "estimate"}, run)
    assert estimate["passed"] is True and "the estimate is at least 70.0%" in estimate["detail"]
    overall = judge({"type": "min_pass_rate", "value": 0.68, "overall": True, "use": "estimate"}, run)
    assert overall["passed"] is True and "overall: 68.4%" in overall["detail"]
    assert judge({"type": "min_pass_rate", "value": 0.68, "overall": True}, run)["passed"] is False


def test_it_fails_a_pass_rate_gate_without_graded_trials_or_for_a_missing_variant():
    only_errors = facts(VariantFacts("base", errors=3))

    assert judge({"type": "min_pass_rate", "value": 0.0}, only_errors)["passed"] is False
    missing = judge({"type": "min_pass_rate", "value": 0.5, "variant": "gone"}, facts(BASE))
    assert missing == {**missing, "passed": False, "detail": "variant 'gone' is not part of this run"}


def test_no_regression_is_a_non_inferiority_test_with_a_5_pp_margin_by_default():
    gate = {"type": "no_regression"}

    dropped = judge(gate, facts(BASE, NEW))
    assert dropped["passed"] is False and "beyond the -5.0 pp margin" in dropped["detail"]
    assert "(40.0% vs 70.0% over the same units)" in dropped["detail"]  # arm rate, then baseline
    assert dropped["name"].startswith("no_regression vs base (margin 5%")
    # Not significant is not enough: the interval allows a drop of 60 pp.
    unknown = VariantFacts("new", 5, 4, versus=versus(-0.3, -0.6, 0.05, p=0.2))
    assert judge(gate, facts(BASE, unknown))["passed"] is False
    better = VariantFacts("new", 10, 0, versus=versus(0.2, 0.1, 0.3, p=0.001))
    result = judge(gate, facts(BASE, better))
    assert result["passed"] is True and "the design detects |Δ| ≥ 4.0 pp" in result["detail"]
    # Only the comparison's 95% intervals can be judged.
    with pytest.raises(ValidationError):
        validate_gates([{**gate, "alpha": 0.01}])


def test_no_regression_says_when_the_design_cannot_detect_its_margin():
    weak = VariantFacts("new", 5, 4, versus=versus(-0.01, -0.3, 0.3, p=0.9, detectable=0.25))
    result = judge({"type": "no_regression"}, facts(BASE, weak))
    assert result["passed"] is False
    assert "cannot decide: the design detects |Δ| ≥ 25.0 pp, more than the 5.0 pp margin" in result["detail"]
    none = VariantFacts("new", 5, 4, versus=versus(-0.01, -1, 1, p=1, detectable=None))
    assert (
        "30 paired clusters detect no Δ at all"
        in judge({"type": "no_regression"}, facts(BASE, none))["detail"]
    )


def test_no_regression_holds_with_every_infrastructure_error_a_fail_or_cannot_decide():
    hides = VariantFacts("new", 7, 3, versus=versus(0.0, -0.03, 0.03, low_if_errors_fail=-0.2))
    result = judge({"type": "no_regression"}, facts(BASE, hides))
    assert result["passed"] is False
    assert (
        "cannot decide: with every infrastructure error a fail the lower bound is -20.0 pp"
        in result["detail"]
    )


def test_no_regression_fails_without_enough_paired_evidence():
    gate = {"type": "no_regression"}

    # The measured case: -50 pp on 6 tasks, not significant, used to pass.
    few = judge(
        gate, facts(BASE, VariantFacts("new", 1, 5, versus=versus(-0.5, -0.9, 0.1, p=0.2, clusters=6)))
    )
    assert few["passed"] is False and "only 6 paired clusters, fewer than the 10" in few["detail"]
    unpaired = judge(gate, facts(BASE, VariantFacts("new", 1, 1)))
    assert unpaired["passed"] is False and "no unit graded in both arms" in unpaired["detail"]
    alone = judge(gate, facts(BASE))
    assert alone["passed"] is False and "only the baseline ran" in alone["detail"]
    untested = VariantFacts("new", 5, 5, versus=versus(-0.1, -0.3, 0.1, p=None, untested="tasks changed"))
    assert judge(gate, facts(BASE, untested))["passed"] is False
    on_baseline = judge({**gate, "variant": "base"}, facts(BASE, NEW))
    assert on_baseline["passed"] is False and "is the baseline" in on_baseline["detail"]
    assert judge(
        {**gate, "min_clusters": 5, "margin": 0.15},
        facts(BASE, VariantFacts("new", 3, 3, versus=versus(0, -0.1, 0.1, p=1, clusters=6, detectable=0.1))),
    )["passed"]


def test_no_regression_with_a_margin_is_a_non_inferiority_check():
    gate = {"type": "no_regression", "margin": 0.05}

    close = VariantFacts("new", 7, 3, versus=versus(-0.01, -0.04, 0.02, p=0.6))
    assert judge(gate, facts(BASE, close))["passed"] is True
    # Not significant, yet the interval allows a drop of 12 pp: not shown non-inferior.
    wide = VariantFacts("new", 7, 3, versus=versus(-0.01, -0.12, 0.1, p=0.8))
    result = judge(gate, facts(BASE, wide))
    assert result["passed"] is False and "beyond the -5.0 pp margin" in result["detail"]
    assert judge({**gate, "margin": 0.15}, facts(BASE, wide))["passed"] is True


def test_min_pass_rate_cannot_decide_when_the_errors_could_hide_fails():
    hiding = VariantFacts("base", 8, 2, errors=5, rate=0.8, low=0.62, high=0.91, low_if_errors_fail=0.4)
    result = judge({"type": "min_pass_rate", "value": 0.6}, facts(hiding))
    assert result["passed"] is False and "cannot decide" in result["detail"]


def test_it_caps_the_error_share_at_the_boundary():
    run = facts(
        VariantFacts("base", passed=9, errors=1),
        VariantFacts("new", passed=7, errors=3),
        overall=VariantFacts("overall", passed=16, errors=4),
    )

    assert judge({"type": "max_error_share", "value": 0.1, "variant": "base"}, run)["passed"] is True
    each = judge({"type": "max_error_share", "value": 0.1}, run)
    assert each["passed"] is False and "new: 3/10 errors = 30.0% > 10.0%" in each["detail"]
    assert judge({"type": "max_error_share", "value": 0.2, "overall": True}, run)["passed"] is True


def test_it_requires_every_dataset_suite_to_pass():
    suites = [
        {"task": "classify", "variant": "base", "passed": True},
        {"task": "classify", "variant": "new", "passed": False},
    ]
    run = facts(BASE, NEW, suites=suites)

    failed = judge({"type": "suite_thresholds"}, run)
    assert failed["passed"] is False and "classify × new" in failed["detail"]
    assert judge({"type": "suite_thresholds", "variant": "base"}, run)["passed"] is True
    # Declared but nothing checked (the dataset task was filtered out): not a silent pass.
    assert judge({"type": "suite_thresholds"}, facts(BASE))["passed"] is False


def test_it_fails_a_stored_gate_that_no_longer_validates():
    (result,) = evaluate_gates([{"type": "min_pass_rate", "valeu": 0.5}], facts(BASE))

    assert result["passed"] is False
    assert "invalid gate spec" in result["detail"] and "valeu" in result["detail"]


def test_it_uses_the_declared_name_and_summarises_verdicts():
    results = evaluate_gates(
        validate_gates([{"type": "min_pass_rate", "value": 0.5, "name": "smoke bar"}]), facts(BASE)
    )

    assert results[0]["name"] == "smoke bar"
    assert all_passed(results) is True
    assert all_passed([]) is None
    assert all_passed([*results, {**results[0], "passed": False}]) is False


def experiment_spec(gates: list) -> dict:
    variants = [{"variant_id": "base"}, {"variant_id": "new"}]
    return {"experiment_id": "gated", "variants": variants, "gates": gates}


def test_it_rejects_gates_with_unknown_keys_variants_or_both_scopes():
    with pytest.raises(ValidationError, match="valeu"):
        ExperimentSpec.model_validate(experiment_spec([{"type": "min_pass_rate", "value": 1, "valeu": 1}]))
    with pytest.raises(ValidationError, match="no variant 'nope'"):
        ExperimentSpec.model_validate(experiment_spec([{"type": "no_regression", "variant": "nope"}]))
    with pytest.raises(ValidationError, match="not both"):
        ExperimentSpec.model_validate(
            experiment_spec([{"type": "max_error_share", "value": 0.1, "variant": "new", "overall": True}])
        )
    with pytest.raises(ValidationError):
        ExperimentSpec.model_validate(experiment_spec([{"type": "min_pass_rate", "value": 1.5}]))


GATED_SMOKE = """
experiment_id: gated-smoke
baseline: reference
tags: [smoke]
variants:
  - variant_id: reference
    agent: {type: oracle}
  - variant_id: no-op
    agent: {type: none}
gates:
  - {type: min_pass_rate, variant: reference, value: 1.0, use: estimate}
  - {type: no_regression, min_clusters: 2}
  - {type: min_pass_rate, value: 0.5}
"""


def write_experiment(tmp_path, text: str):
    path = tmp_path / "experiment.yaml"
    path.write_text(textwrap.dedent(text).lstrip())
    return path


@pytest.mark.django_db
def test_it_reports_a_bad_gate_with_file_and_line(tmp_path):
    path = write_experiment(tmp_path, GATED_SMOKE.replace("variant: reference, value: 1.0", "value: 2"))

    with pytest.raises(ImportFailed) as failed:
        import_experiment(path)

    assert any(f"{path}:10: gates[0].value" in issue for issue in failed.value.issues), failed.value.issues


@pytest.mark.django_db
def test_it_stores_the_gates_and_judges_them_when_the_run_ends(tmp_path):
    import_tasks([EXAMPLES / "tasks"])
    experiment = import_experiment(write_experiment(tmp_path, GATED_SMOKE)).experiment
    assert experiment.gates[1] == {
        "type": "no_regression",
        "alpha": 0.05,
        "variant": None,
        "name": None,
        "margin": 0.05,
        "min_clusters": 2,
        "cluster": "unit",
    }

    run = launch_run(experiment, options=LaunchOptions())
    assert run.gates == experiment.gates
    trials = Trial.objects.filter(run=run)
    trials.filter(variant__slug="reference").update(status=Trial.Status.PASSED)
    trials.filter(variant__slug="no-op").update(status=Trial.Status.FAILED)
    control.refresh_run(run.pk)

    run.refresh_from_db()
    assert run.status == Run.Status.FINISHED
    assert [gate["passed"] for gate in run.gate_results] == [True, False, False]
    # 3 tasks, all lost by no-op: a drop of 100 pp, and 3 clusters could show no margin anyway
    # (not significant used to pass this gate).
    assert "3 paired clusters detect no Δ at all" in run.gate_results[1]["detail"]
    assert run.gates_passed is False


@pytest.mark.django_db
def test_a_gate_may_cluster_units_by_task():
    from runs_app.analysis.load import run_facts
    from runs_app.tests.analysis.test_comparison import make_experiment, make_run

    rows = {("ds", v, i): f"r{i}" for v in ("base", "new") for i in range(12)}
    run = make_run(make_experiment(), {"ds": {"base": "P" * 12, "new": "P" * 12}}, dataset_row_id=rows)
    # 12 paired clusters cannot show a 5 pp margin (an effect on a few rows could be unseen in
    # 12: the interval is about ±26 pp); a 30 pp one they can.
    gate = {"type": "no_regression", "margin": 0.3}
    gates = validate_gates([gate, {**gate, "cluster": "task"}])

    by_unit, by_task = evaluate_gates(gates, run_facts(run, [], {"task"}))

    assert by_unit["passed"] is True, by_unit["detail"]  # 12 rows are 12 paired clusters
    assert by_task["passed"] is False and "only 1 paired clusters" in by_task["detail"]
    assert by_task["name"].endswith("[clustered by task]") and "units clustered by task" in by_task["detail"]
