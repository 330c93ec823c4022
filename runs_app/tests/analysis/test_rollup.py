"""Unit tallies stay equal to the trials they sum through every change a run's trials go through:
a finishing trial (while the run is in progress), the reaper, cancel, retry, resume and `evaluate`,
and old runs without tallies are rolled up when first read."""

import threading
import time
from dataclasses import fields
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from runs_app import control
from runs_app.analysis import load, rollup
from runs_app.analysis.stats.comparison import Cell
from runs_app.engine import runner
from runs_app.models import CriterionResult, Run, Trial, UnitTally, Worker
from runs_app.tests.factories import assert_tallies_match, launched_smoke_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks():  # no broker message: these tests play the worker
        return launched_smoke_run()


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


def _store_as_the_runner_does(trial: Trial, status: str, passed: bool) -> None:
    """Claim, then store the outcome and count it in one transaction, as `runner.persist` does."""
    assert runner.claim(trial.pk, "w")
    with transaction.atomic():
        _finish(trial, status, passed)
        locked = Run.objects.select_for_update().get(pk=trial.run_id)
        trial.refresh_from_db()
        rollup.add_finished(locked, trial, list(trial.criterion_results.all()))


def test_each_stored_outcome_is_counted_once_while_the_run_is_in_progress(run):
    first, second, third, *rest = Trial.objects.filter(run=run).order_by("pk")
    assert runner.claim(third.pk, "w")
    assert Run.objects.get(pk=run.pk).n_running == 1
    _store_as_the_runner_does(first, Trial.Status.PASSED, True)
    assert_tallies_match(run)
    _store_as_the_runner_does(second, Trial.Status.FAILED, False)
    assert_tallies_match(run)
    stored = Run.objects.get(pk=run.pk)
    counts = {name: getattr(stored, f"n_{name}") for name in Trial.Status.values}
    rollup.recount(stored)  # what a full recount finds: the same counts
    assert counts == {name: getattr(stored, f"n_{name}") for name in Trial.Status.values}
    assert counts["running"] == 1 and counts["passed"] == 1 and counts["failed"] == 1
    arms = load.compare_runs([run]).arms
    assert sum(arm.passed for arm in arms) == 1 and sum(arm.failed for arm in arms) == 1
    control.after_trial(run.pk, ())
    assert Run.objects.get(pk=run.pk).status != Run.Status.FINISHED


@pytest.mark.django_db(transaction=True)  # the worker's thread opens its own connection
def test_an_outcome_stored_while_a_recount_holds_the_run_is_counted_once(run):
    """The runner writes the outcome, then takes the run's row to count it; a recount (cancel,
    resume, the reaper) that holds that row meanwhile has counted the trial as still running."""
    trial = Trial.objects.filter(run=run, variant__slug="reference").order_by("pk").first()
    assert runner.claim(trial.pk, "w")
    Run.objects.mark_started(run.pk)  # as the run's first trial did
    postgres = connection.vendor == "postgresql"
    outcome = {}

    def work() -> None:
        try:
            outcome["status"], _ = runner.run_claimed(trial.pk, "w", rollup.add_finished)
        finally:
            connections.close_all()

    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        worker = threading.Thread(target=work)
        worker.start()
        deadline = time.monotonic() + 20
        while postgres and not _waits_on_the_run_with_its_outcome_written() and time.monotonic() < deadline:
            time.sleep(0.05)
        if postgres:  # the outcome and its criteria are written before the run's row is awaited
            assert _waits_on_the_run_with_its_outcome_written()
        rollup.recount(locked)
        counted = Run.objects.get(pk=run.pk)
        assert counted.n_running == 1 and counted.n_passed == 0
    worker.join(60)
    assert outcome["status"] == Trial.Status.PASSED
    stored = Run.objects.get(pk=run.pk)
    counts = {name: getattr(stored, f"n_{name}") for name in Trial.Status.values}
    assert counts["passed"] == 1 and counts["running"] == 0
    rollup.recount(stored)
    assert counts == {name: getattr(stored, f"n_{name}") for name in Trial.Status.values}
    assert_tallies_match(run)


def _waits_on_the_run_with_its_outcome_written() -> bool:
    """Whether another session waits on a row lock while holding the rows it inserted into
    runs_app_criterionresult (PostgreSQL's pg_locks)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM pg_locks waiting JOIN pg_locks held ON held.pid = waiting.pid "
            "JOIN pg_class c ON c.oid = held.relation WHERE NOT waiting.granted "
            "AND c.relname = 'runs_app_criterionresult' AND held.mode = 'RowExclusiveLock' "
            "AND waiting.pid <> pg_backend_pid()"
        )
        return cursor.fetchone() is not None


def test_the_reaper_cancel_retry_and_resume_keep_the_tallies_current(
    run, settings, django_capture_on_commit_callbacks
):
    settings.TRIAL_MAX_ATTEMPTS = 1
    trials = list(Trial.objects.filter(run=run).order_by("pk"))
    assert runner.claim(trials[0].pk, "dead-worker")
    Trial.objects.filter(pk=trials[0].pk).update(lease_expires_at=timezone.now() - timedelta(seconds=60))
    Worker.objects.create(
        name="alive", reachable_since=timezone.now() - timedelta(hours=1), last_seen_at=timezone.now()
    )
    control.reap_expired_leases()  # the last allowed attempt: error
    assert_tallies_match(run)
    _store_as_the_runner_does(trials[1], Trial.Status.PASSED, True)
    control.after_trial(run.pk, ())

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


def test_a_kept_comparison_holds_until_the_runs_tallies_change(run):
    before = load.comparison([run])
    assert load.comparison([run]) is before  # the same state: computed once
    trial = Trial.objects.filter(run=run).order_by("pk").first()
    _store_as_the_runner_does(trial, Trial.Status.PASSED, True)
    run = Run.objects.get(pk=run.pk)
    after = load.comparison([run])
    assert after is not before and sum(arm.passed for arm in after.arms) == 1
    assert sum(arm.passed for arm in before.arms) == 0


def test_a_run_from_before_the_tallies_still_counts_each_stored_outcome(run):
    UnitTally.objects.filter(run=run).delete()
    Run.objects.filter(pk=run.pk).update(tallied=False)
    _store_as_the_runner_does(Trial.objects.filter(run=run).order_by("pk").first(), Trial.Status.PASSED, True)
    stored = Run.objects.get(pk=run.pk)
    assert (stored.n_passed, stored.tallied) == (1, False)
    assert sum(arm.passed for arm in load.compare_runs([stored]).arms) == 1  # rolled up when read
    assert_tallies_match(run)


def test_a_tally_row_fills_a_cell_in_field_order():
    names = [f.name for f in fields(Cell)]
    assert names[: len(load.CELL_FIELDS)] == list(load.CELL_FIELDS)
