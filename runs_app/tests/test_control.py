"""Run control without a worker: the reaper, cancel and the launch cap, on rows made directly."""

from datetime import timedelta
from unittest import mock

import pytest
from django.db import OperationalError
from django.utils import timezone

from runs_app import control
from runs_app.engine import runner
from runs_app.launching import LaunchError, LaunchOptions, launch_run
from runs_app.models import Run, Trial
from runs_app.tests.factories import EXAMPLES, import_examples

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(django_capture_on_commit_callbacks):
    from experiments_app.definitions import import_experiment

    import_examples()
    smoke = import_experiment(EXAMPLES / "experiments" / "smoke.yaml", root=EXAMPLES).experiment
    with django_capture_on_commit_callbacks():  # no broker message: these tests play the worker
        return launch_run(smoke)


def _claim_and_expire(trial: Trial) -> None:
    assert runner.claim(trial.pk, "dead-worker")
    Trial.objects.filter(pk=trial.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=5))


def test_the_reaper_requeues_a_dead_workers_trial_with_a_new_attempt(run):
    trial = Trial.objects.filter(run=run).first()
    _claim_and_expire(trial)

    assert control.reap_expired_leases() == 1

    trial.refresh_from_db()
    assert (trial.status, trial.attempt, trial.lease_owner) == ("queued", 2, "")


def test_the_reaper_marks_the_last_allowed_attempt_as_error(run, settings):
    settings.TRIAL_MAX_ATTEMPTS = 1
    trial = Trial.objects.filter(run=run).first()
    _claim_and_expire(trial)

    control.reap_expired_leases()

    trial.refresh_from_db()
    assert (trial.status, trial.error_category) == ("error", "lost")


def test_the_reaper_ends_a_cancelled_runs_orphaned_trial_and_the_run(run):
    trial = Trial.objects.filter(run=run).first()
    _claim_and_expire(trial)
    control.cancel_run(run, control.COMMAND_LINE)

    control.reap_expired_leases()

    trial.refresh_from_db()
    run.refresh_from_db()
    assert trial.status == "cancelled"
    assert run.status == "cancelled" and run.n_queued == run.n_running == 0


@pytest.mark.django_db(transaction=True)  # its thread opens its own connection
def test_the_heartbeat_survives_a_database_error(run, settings):
    settings.TRIAL_LEASE_SECONDS = 3
    trial = Trial.objects.filter(run=run).first()
    heartbeat = runner.Heartbeat(trial, "w")
    calls = {"n": 0}
    real_filter = Run.objects.filter

    def flaky_filter(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise OperationalError("database is locked")
        return real_filter(*args, **kwargs)

    with mock.patch.object(Run.objects, "filter", side_effect=flaky_filter):
        heartbeat.start()
        try:
            deadline = timezone.now() + timedelta(seconds=5)
            while calls["n"] < 3 and timezone.now() < deadline:
                heartbeat.join(0.1)
            assert heartbeat.is_alive() and calls["n"] >= 3
        finally:
            heartbeat.stopping.set()
            heartbeat.join(5)


def test_a_launch_refuses_more_trials_than_the_cap(run, settings):
    settings.MAX_TRIALS_PER_RUN = 10

    with pytest.raises(LaunchError, match="more than 10 trials"):
        launch_run(run.experiment, options=LaunchOptions(repeats=1_000_000_000))
    assert Run.objects.count() == 1
