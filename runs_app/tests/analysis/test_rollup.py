"""Unit tallies stay equal to the trials they sum through every change a run's trials go through:
a finishing trial (while the run is in progress), the reaper, cancel, retry, resume and `evaluate`,
and old runs without tallies are rolled up when first read."""

from datetime import timedelta

import pytest
from django.utils import timezone

from runs_app import control
from runs_app.analysis import load
from runs_app.engine import runner
from runs_app.launching import launch_run
from runs_app.models import CriterionResult, Run, Trial, UnitTally
from runs_app.tests.factories import EXAMPLES, assert_tallies_match, import_examples

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(django_capture_on_commit_callbacks):
    from experiments_app.definitions import import_experiment

    import_examples()
    smoke = import_experiment(EXAMPLES / "experiments" / "smoke.yaml", root=EXAMPLES).experiment
    with django_capture_on_commit_callbacks():  # no broker message: these tests play the worker
        return launch_run(smoke)


def _finish(trial: Trial, status: str, passed: bool) -> None:
    """What the runner stores for a graded trial."""
    now = timezone.now()
    Trial.objects.filter(pk=trial.pk).update(
        status=status, started_at=now, finished_at=now, duration_seconds=2.0, score=float(passed),
        input_tokens=10, output_tokens=5, cost_usd=0.01,
    )  # fmt: skip
    CriterionResult.objects.create(trial=trial, index=0, type="command", score=float(passed), passed=passed)


def test_a_launch_tallies_every_unit_as_pending(run):
    assert run.tallied
    assert_tallies_match(run)
    assert sum(UnitTally.objects.filter(run=run).values_list("total", flat=True)) == run.n_trials == 6


def test_each_finishing_trial_updates_its_unit_while_the_run_is_in_progress(run):
    first, second, *rest = Trial.objects.filter(run=run).order_by("pk")
    _finish(first, Trial.Status.PASSED, True)
    control.after_trial(run.pk, [first.pk])
    assert_tallies_match(run)
    _finish(second, Trial.Status.FAILED, False)
    control.after_trial(run.pk, [second.pk])
    assert_tallies_match(run)
    arms = load.compare_runs([run]).arms
    assert sum(arm.passed for arm in arms) == 1 and sum(arm.failed for arm in arms) == 1
    assert Run.objects.get(pk=run.pk).status != Run.Status.FINISHED


def test_the_reaper_cancel_retry_and_resume_keep_the_tallies_current(
    run, settings, django_capture_on_commit_callbacks
):
    settings.TRIAL_MAX_ATTEMPTS = 1
    trials = list(Trial.objects.filter(run=run).order_by("pk"))
    assert runner.claim(trials[0].pk, "dead-worker")
    Trial.objects.filter(pk=trials[0].pk).update(lease_expires_at=timezone.now() - timedelta(seconds=5))
    control.reap_expired_leases()  # the last allowed attempt: error
    assert_tallies_match(run)
    _finish(trials[1], Trial.Status.PASSED, True)
    control.after_trial(run.pk, [trials[1].pk])

    with django_capture_on_commit_callbacks():
        control.cancel_run(run, control.COMMAND_LINE)
        assert_tallies_match(run)
        assert control.retry_errors(run, control.COMMAND_LINE) == 1
        assert_tallies_match(run)
        control.resume_run(run, control.COMMAND_LINE)
        assert_tallies_match(run)
    summary = load.compare_runs([run])
    assert sum(arm.passed for arm in summary.arms) == 1
    assert sum(arm.errors for arm in summary.arms) == 0  # the errored trial's new attempt waits


def test_a_run_from_before_the_tallies_is_rolled_up_when_first_read(run):
    UnitTally.objects.filter(run=run).delete()
    Run.objects.filter(pk=run.pk).update(tallied=False)
    old = Run.objects.get(pk=run.pk)
    assert sum(arm.trials for arm in load.compare_runs([old]).arms) == 6
    assert Run.objects.get(pk=run.pk).tallied
    assert_tallies_match(run)
