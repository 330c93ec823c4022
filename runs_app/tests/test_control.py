"""Run control without a worker: the reaper, cancel and the launch cap, on rows made directly."""

from datetime import timedelta
from unittest import mock

import pytest
from django.db import OperationalError
from django.utils import timezone

from runs_app import control
from runs_app.analysis import rollup
from runs_app.engine import leases, runner, trial_sandbox
from runs_app.launching import LaunchError, LaunchOptions, launch_run
from runs_app.models import Run, Trial, Worker
from runs_app.tests.factories import launched_smoke_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks():  # no broker message: these tests play the worker
        return launched_smoke_run()


def _claim_and_expire(trial: Trial) -> None:
    """Claimed by a worker that died a minute ago, while another worker kept reporting."""
    assert runner.claim(trial.pk, "dead-worker")
    now = timezone.now()
    Trial.objects.filter(pk=trial.pk).update(lease_expires_at=now - timedelta(seconds=60))
    Worker.objects.update_or_create(
        name="celery@alive", defaults={"reachable_since": now - timedelta(hours=1), "last_seen_at": now}
    )


def test_the_reaper_requeues_a_dead_workers_trial_with_a_new_attempt(run):
    trial = Trial.objects.filter(run=run).first()
    _claim_and_expire(trial)

    assert control.reap_expired_leases() == 1

    trial.refresh_from_db()
    assert (trial.status, trial.attempt, trial.lease_owner) == ("queued", 2, "")


def test_the_reaper_leaves_a_lease_that_ran_out_while_no_worker_reached_the_database(run):
    trial = Trial.objects.filter(run=run).first()
    assert runner.claim(trial.pk, "celery@a:11")
    now = timezone.now()
    expired = now - timedelta(seconds=25)
    Trial.objects.filter(pk=trial.pk).update(lease_expires_at=expired)
    # Every worker's reports stopped with the outage; one came back a second ago.
    Worker.objects.create(name="celery@a", reachable_since=now - timedelta(seconds=1), last_seen_at=now)
    Worker.objects.create(name="celery@b", reachable_since=now - timedelta(hours=1), last_seen_at=expired)

    assert control.reap_expired_leases() == 0

    trial.refresh_from_db()
    assert (trial.status, trial.attempt, trial.lease_owner) == ("running", 1, "celery@a:11")


def test_a_lease_is_lost_once_a_worker_reached_the_database_for_two_reports_after_it_ran_out(settings):
    settings.WORKER_HEARTBEAT_SECONDS = 10
    now = timezone.now()
    expired = now - timedelta(seconds=30)
    back = [(now - timedelta(seconds=3), now)]  # back 3 s ago: its processes are renewing
    steady = [(now - timedelta(hours=1), now)]  # never lost it: the holder is gone
    returned = [(expired + timedelta(seconds=5), expired + timedelta(seconds=15))]  # 10 s after

    assert not control.holder_gone(expired, back)
    assert not control.holder_gone(expired, [])  # nobody reports: nobody could run it anyway
    assert control.holder_gone(expired, steady)
    assert control.holder_gone(expired, back + returned)


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
def test_the_lease_keeper_survives_a_database_error_and_renews_every_lease(run, settings):
    settings.TRIAL_LEASE_SECONDS = 1.5
    trials = list(Trial.objects.filter(run=run)[:3])
    keeper = leases.LeaseKeeper()
    for trial in trials:
        assert runner.claim(trial.pk, "w")
        keeper.add(leases.Heartbeat(trial, "w"))
    Trial.objects.filter(pk=trials[2].pk).update(lease_owner="someone-else")  # reaped, taken
    calls = {"n": 0}
    real_filter = Run.objects.filter

    def flaky_filter(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise OperationalError("database is locked")
        return real_filter(*args, **kwargs)

    before = timezone.now()
    with mock.patch.object(Run.objects, "filter", side_effect=flaky_filter):
        keeper.start()
        try:
            deadline = timezone.now() + timedelta(seconds=5)
            while calls["n"] < 3 and timezone.now() < deadline:
                keeper.join(0.1)
            assert keeper.is_alive() and calls["n"] >= 3
        finally:
            keeper.stopping.set()
            keeper.join(5)
    expiries = dict(Trial.objects.filter(pk__in=[t.pk for t in trials]).values_list("pk", "lease_expires_at"))
    assert all(expiries[t.pk] > before + timedelta(seconds=1.4) for t in trials[:2])
    lost = [beat.trial_id for beat in keeper.beats if beat.stop_reason() == "lease_lost"]
    assert lost == [trials[2].pk]


def test_a_launch_refuses_more_trials_than_the_cap(run, settings):
    settings.MAX_TRIALS_PER_RUN = 10

    with pytest.raises(LaunchError, match="more than 10 trials"):
        launch_run(run.experiment, options=LaunchOptions(repeats=1_000_000_000))
    assert Run.objects.count() == 1


# --- who may control a run, and historical runs --------------------------------------------------


@pytest.fixture
def historical():
    """An imported coder-eval run (read-only) with one errored trial."""
    from runs_app.tests.test_coder_eval_import import RUNS, import_run

    run = import_run(RUNS / "ab")
    Trial.objects.filter(pk=Trial.objects.filter(run=run).first().pk).update(status=Trial.Status.ERROR)
    rollup.recount(run)
    return run


@pytest.mark.parametrize("action", [control.retry_errors, control.resume_run, control.cancel_run])
def test_it_refuses_to_retry_resume_or_cancel_a_historical_run(historical, admin_user, action):
    for who in (admin_user, control.COMMAND_LINE):
        with pytest.raises(control.ControlRefused, match=r"imported from coder-eval and is read-only"):
            action(historical, who)

    historical.refresh_from_db()
    assert historical.status == Run.Status.FINISHED and historical.finished_at is not None
    assert (historical.n_error, Trial.objects.filter(run=historical).count()) == (1, 12)


def test_the_pages_the_api_and_the_command_line_say_why_a_historical_run_stays_as_it_is(
    historical, admin_client, admin_user
):
    from django.core.management import CommandError, call_command
    from django.urls import reverse

    from runs_app.tokens import create_token

    page = admin_client.post(reverse("run_retry", args=[historical.pk]), follow=True)
    _, token = create_token(admin_user, "ci")
    api = admin_client.post(
        f"/api/runs/{historical.pk}/retry-errors", headers={"Authorization": f"Bearer {token}"}
    )
    with pytest.raises(CommandError, match="read-only") as cli:
        call_command("evalrun", "--resume", str(historical.pk))

    assert b"imported from coder-eval and is read-only" in page.content
    assert api.status_code == 409 and "read-only" in api.json()["detail"]
    assert cli.value.returncode == 2
    historical.refresh_from_db()
    assert historical.status == Run.Status.FINISHED


def test_only_the_starter_or_staff_may_control_a_run(run, member, outsider, admin_user):
    Run.objects.filter(pk=run.pk).update(started_by=member)
    run.refresh_from_db()

    with pytest.raises(control.ControlRefused, match="only the person who started") as refused:
        control.cancel_run(run, outsider)
    assert refused.value.forbidden
    control.ensure_controllable(run, member)
    control.ensure_controllable(run, admin_user)
    assert not Run.objects.get(pk=run.pk).cancel_requested


def test_control_sends_the_celery_tasks_by_their_registered_names():
    from runs_app import tasks

    assert tasks.execute_trial.name == control.EXECUTE_TRIAL
    assert tasks.dispatch_run.name == control.DISPATCH_RUN


def test_a_finishing_run_is_summarised_with_its_row_lock_released(run, monkeypatch):
    from django.db import connection

    depth_outside = len(connection.atomic_blocks)  # the test's own transaction
    depths = []
    judge = control._judge_gates

    def spy(*args):
        depths.append(len(connection.atomic_blocks))
        return judge(*args)

    monkeypatch.setattr(control, "_judge_gates", spy)
    Run.objects.filter(pk=run.pk).update(gates=[{"type": "min_pass_rate", "value": 0.5, "use": "estimate"}])
    Trial.objects.filter(run=run).update(status=Trial.Status.PASSED, score=1.0)

    assert control.after_trial(run.pk) is None

    run.refresh_from_db()
    assert depths == [depth_outside]
    assert run.status == Run.Status.FINISHED and run.gates_passed is True
    assert run.gate_results[0]["passed"]


@pytest.mark.parametrize("own_trial_root", [False, True])
def test_a_starting_worker_sweeps_the_trial_folders_nobody_runs(run, settings, tmp_path, own_trial_root):
    settings.SANDBOX_ROOT = tmp_path
    trials = settings.TRIAL_ROOT = tmp_path / "trials" if own_trial_root else tmp_path
    live, dead = Trial.objects.filter(run=run)[:2]
    assert runner.claim(live.pk, "this-host")  # running, with a fresh lease
    kept = trials / f"trial-{live.pk}-a1-aaaa1111"
    gone = [trials / f"trial-{dead.pk}-a1-bbbb2222", trials / "trial-999999-a3-cccc3333"]
    for folder in [kept, *gone]:
        (folder / "workspace").mkdir(parents=True)
    (tmp_path / "runtimes").mkdir()

    assert trial_sandbox.sweep_sandboxes() == 2

    assert kept.exists() and (tmp_path / "runtimes").exists()
    assert not any(folder.exists() for folder in gone)
