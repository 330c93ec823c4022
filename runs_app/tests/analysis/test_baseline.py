"""A baseline with nothing to compare (no trial, or none graded) is said, never replaced by
another arm's numbers."""

import pytest
from django.urls import reverse

from runs_app.analysis import reports
from runs_app.analysis.load import compare_runs, run_facts
from runs_app.analysis.stats import records
from runs_app.analysis.stats.gates import evaluate_gates, validate_gates
from runs_app.tests.analysis.test_comparison import make_experiment, make_run

pytestmark = pytest.mark.django_db

NO_REGRESSION = validate_gates([{"type": "no_regression", "min_clusters": 2}])


def test_a_baseline_whose_trials_all_errored_is_flagged_and_nothing_is_compared():
    outcomes = {f"t{i}": {"base": "EE", "new": "PF"} for i in range(12)}
    run = make_run(make_experiment(), outcomes, baseline="base")

    summary = compare_runs([run])

    base, new = summary.arms
    assert base.is_baseline and base.pass_rate is None and new.versus is None
    assert summary.baseline_problem.startswith("The baseline, base, has no graded trial (24 ended in infra")
    assert summary.warnings[0] == summary.baseline_problem
    record = records.comparison_record(summary)
    assert record["baseline_problem"] == summary.baseline_problem and record["arms"][1]["delta"] is None
    (gate,) = evaluate_gates(NO_REGRESSION, run_facts(run, []))
    assert gate["passed"] is False and gate["detail"] == summary.baseline_problem
    assert summary.baseline_problem in reports.render_text_table(reports.build_report(run))


def test_a_baseline_without_trials_is_not_replaced_by_the_first_arm(member_client):
    experiment = make_experiment(variants=("base", "new", "other"))
    outcomes = {f"t{i}": {"new": "P", "other": "F"} for i in range(12)}
    run = make_run(experiment, outcomes, baseline="base")

    summary = compare_runs([run])

    assert summary.baseline == "base" and not any(arm.is_baseline for arm in summary.arms)
    assert all(arm.versus is None for arm in summary.arms)
    assert summary.baseline_problem == (
        f"The baseline, base, has no trial in run #{run.pk}: no variant is compared with it, and none "
        "with another in its place. Choose a baseline in the form above, or run it."
    )
    chosen = compare_runs([run], baseline="new")  # a choice made on purpose is honoured
    assert not chosen.baseline_problem and chosen.arm("other").versus.delta == -1.0

    for url in (reverse("run_compare", args=[run.pk]), reverse("run_detail", args=[run.pk])):
        page = member_client.get(url).content.decode()
        assert 'data-testid="baseline-problem"' in page and "has no trial in run #" in page
    page = member_client.get(reverse("run_compare", args=[run.pk]) + "?baseline=new").content.decode()
    assert 'data-testid="baseline-problem"' not in page
