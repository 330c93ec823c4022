"""Run control in plain Python: dispatch with per-run concurrency, finishing, cancel, retry,
resume and the lease reaper. Celery tasks in tasks.py only call these.
"""

import logging
from datetime import timedelta
from functools import partial

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from runs_app import gates
from runs_app.models import Run, Trial, TrialEvent

logger = logging.getLogger(__name__)

PENDING = (Trial.Status.QUEUED, Trial.Status.RUNNING)


def dispatch(run_id: int, reserve: bool = False) -> int | None:
    """Fill the run's free slots (max_parallel minus trials running or already sent) with queued
    trials, breadth-first over replicates, and enqueue them once committed.

    With `reserve`, the first picked trial is not enqueued but returned: the calling worker,
    which just freed a slot, runs it next without a broker round trip (the filesystem broker
    polls every 0.1 s, which would otherwise idle each worker process between short trials).
    A worker that dies holding a reservation is covered by the reaper's re-dispatch."""
    with transaction.atomic():
        # The row lock serialises concurrent dispatches of one run (SQLite's IMMEDIATE
        # transactions already do), so max_parallel holds across any number of workers.
        run = Run.objects.select_for_update().filter(pk=run_id).first()
        if run is None:
            return None
        return _dispatch_locked(run, reserve)


def _dispatch_locked(run: Run, reserve: bool, occupied: int | None = None) -> int | None:
    """dispatch() for a run whose row the current transaction has locked. `occupied` (trials
    running or sent) may come from a recount made in the same transaction."""
    from runs_app.tasks import execute_trial

    if run.cancel_requested or run.is_final or run.historical:
        return None
    current = Trial.objects.filter(run=run, is_latest=True)
    if occupied is None:
        occupied = current.filter(
            Q(status=Trial.Status.RUNNING) | Q(status=Trial.Status.QUEUED, dispatched_at__isnull=False)
        ).count()
    free = run.max_parallel - occupied
    if free <= 0:
        return None
    ids = list(
        current.filter(status=Trial.Status.QUEUED, dispatched_at__isnull=True)
        .order_by("replicate", "pk")
        .values_list("pk", flat=True)[:free]
    )
    Trial.objects.filter(pk__in=ids).update(dispatched_at=timezone.now())
    reserved = ids.pop(0) if reserve and ids else None
    for trial_id in ids:
        transaction.on_commit(partial(execute_trial.delay, trial_id))
    return reserved


def release(trial_id: int) -> None:
    """Give back a reserved trial the worker could not claim, so it is dispatched normally."""
    run_id = Trial.objects.filter(pk=trial_id).values_list("run_id", flat=True).first()
    Trial.objects.filter(pk=trial_id, status=Trial.Status.QUEUED).update(dispatched_at=None)
    if run_id is not None:
        dispatch(run_id)


def refresh_run(run_id: int) -> Run:
    """Recount the run from its trials and finish it when nothing is pending."""
    with transaction.atomic():
        # Locked, so two workers finishing at once cannot write a stale count last.
        run = Run.objects.select_for_update().get(pk=run_id)
        run.refresh_counts()
        if not run.is_final and run.n_queued + run.n_running == 0 and run.n_trials:
            _finish(run)
    return run


def _finish(run: Run) -> None:
    from runs_app.suites import evaluate_suites

    run.status = Run.Status.CANCELLED if run.cancel_requested else Run.Status.FINISHED
    run.finished_at = timezone.now()
    run.suite_results = evaluate_suites(run)
    # Gates read the suites above, so they come last.
    run.gate_results = gates.evaluate_run(run)
    run.gates_passed = gates.all_passed(run.gate_results)
    run.save(update_fields=["status", "finished_at", "suite_results", "gate_results", "gates_passed"])
    logger.info("run %s %s: %s passed, %s failed, %s errors", run.pk, run.status, run.n_passed,
                run.n_failed, run.n_error)  # fmt: skip


def after_trial(run_id: int, reserve: bool = False) -> int | None:
    """Called when a trial of the run reached a final state; returns a reserved trial to run
    next when `reserve` is asked (see dispatch)."""
    with transaction.atomic():
        # One locked transaction recounts, then finishes the run or fills the freed slot.
        run = Run.objects.select_for_update().get(pk=run_id)
        sent = run.refresh_counts()
        if not run.is_final and run.n_queued + run.n_running == 0 and run.n_trials:
            _finish(run)
            return None
        return _dispatch_locked(run, reserve, occupied=run.n_running + sent)


def mark_run_started(run_id: int) -> None:
    Run.objects.filter(pk=run_id, status=Run.Status.QUEUED).update(
        status=Run.Status.RUNNING, started_at=timezone.now()
    )


def cancel_run(run: Run) -> Run:
    """Stop dispatching, cancel what waits; running agents see the flag within half a second
    and are killed, their trials ending `cancelled`."""
    now = timezone.now()
    with transaction.atomic():
        Run.objects.filter(pk=run.pk).update(cancel_requested=True)
        Trial.objects.filter(run=run, is_latest=True, status=Trial.Status.QUEUED).update(
            status=Trial.Status.CANCELLED, finished_at=now, error_category="cancelled"
        )
    return refresh_run(run.pk)


def retry_errors(run: Run) -> int:
    """New attempts for the run's errored trials (the old ones are kept); passed and failed
    trials never run again."""
    with transaction.atomic():
        errored = list(
            Trial.objects.select_for_update().filter(run=run, is_latest=True, status=Trial.Status.ERROR)
        )
        if not errored:
            return 0
        Trial.objects.filter(pk__in=[t.pk for t in errored]).update(is_latest=False)
        Trial.objects.bulk_create([_next_attempt(t) for t in errored])
        _reopen(run)
    dispatch(run.pk)
    return len(errored)


def resume_run(run: Run) -> int:
    """Finish a crashed or cancelled run: trials that never reached an outcome run again;
    passed, failed and errored trials are kept."""
    with transaction.atomic():
        Trial.objects.filter(run=run, is_latest=True, status=Trial.Status.CANCELLED).update(
            status=Trial.Status.QUEUED, attempt=F("attempt") + 1, dispatched_at=None, finished_at=None,
            error_category="", error_message="",
        )  # fmt: skip
        # A crashed worker's trials: the reaper would return them once their lease expires;
        # resuming says the operator knows the worker is gone.
        Trial.objects.filter(run=run, is_latest=True, status=Trial.Status.RUNNING).update(
            status=Trial.Status.QUEUED, attempt=F("attempt") + 1, dispatched_at=None,
            lease_owner="", lease_expires_at=None,
        )  # fmt: skip
        Trial.objects.filter(run=run, is_latest=True, status=Trial.Status.QUEUED).update(dispatched_at=None)
        pending = Trial.objects.filter(run=run, is_latest=True, status=Trial.Status.QUEUED).count()
        _reopen(run)
    dispatch(run.pk)
    # With nothing left to run no trial will end to finish the run: finish it here.
    refresh_run(run.pk)
    return pending


def _reopen(run: Run) -> None:
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING, cancel_requested=False, finished_at=None)
    run.refresh_from_db()
    run.refresh_counts()


def _next_attempt(trial: Trial) -> Trial:
    return Trial(
        run_id=trial.run_id,
        task_version_id=trial.task_version_id,
        variant_id=trial.variant_id,
        replicate=trial.replicate,
        dataset_row_id=trial.dataset_row_id,
        dataset_row=trial.dataset_row,
        config=trial.config,
        lineage=trial.lineage,
        prompt=trial.prompt,
        config_fingerprint=trial.config_fingerprint,
        attempt=trial.attempt + 1,
        previous_attempt=trial,
    )


def reap_expired_leases() -> int:
    """Put running trials whose worker died (lease expired) back in the queue, up to the
    attempt limit, then mark them `error`; re-dispatch queued trials whose message was lost."""
    now = timezone.now()
    runs = set()
    reaped = 0
    expired = Trial.objects.filter(status=Trial.Status.RUNNING, lease_expires_at__lt=now)
    rows = expired.values_list("pk", "run_id", "attempt", "lease_owner", "run__cancel_requested")
    for trial_id, run_id, attempt, owner, cancelled in rows:
        still_expired = Trial.objects.filter(
            pk=trial_id, status=Trial.Status.RUNNING, lease_expires_at__lt=now
        )
        if cancelled:
            # Its run was cancelled meanwhile: nothing would ever claim it again.
            changed = still_expired.update(
                status=Trial.Status.CANCELLED, finished_at=now, error_category="cancelled",
                lease_owner="", lease_expires_at=None,
            )  # fmt: skip
            note = f"worker {owner} died after the run was cancelled"
        elif attempt < settings.TRIAL_MAX_ATTEMPTS:
            changed = still_expired.update(
                status=Trial.Status.QUEUED, attempt=attempt + 1, dispatched_at=None,
                lease_owner="", lease_expires_at=None, started_at=None,
            )  # fmt: skip
            note = f"worker {owner} stopped renewing its lease; attempt {attempt + 1} queued"
        else:
            changed = still_expired.update(
                status=Trial.Status.ERROR, finished_at=now, error_category="lost",
                error_message=f"the worker running attempt {attempt} died, and this was the last "
                f"attempt allowed (TRIAL_MAX_ATTEMPTS={settings.TRIAL_MAX_ATTEMPTS})",
            )  # fmt: skip
            note = f"worker {owner} died on the last allowed attempt"
        if changed:
            reaped += 1
            runs.add(run_id)
            _append_event(trial_id, TrialEvent.Kind.SYSTEM, {"text": note})
            logger.warning("trial %s: %s", trial_id, note)
    stale = now - timedelta(seconds=settings.REDISPATCH_AFTER_SECONDS)
    lost = Trial.objects.filter(status=Trial.Status.QUEUED, is_latest=True, dispatched_at__lt=stale)
    runs.update(lost.values_list("run_id", flat=True).distinct())
    lost.update(dispatched_at=None)
    # Runs that still wait on work (e.g. every message of a killed worker was lost).
    runs.update(
        Run.objects.filter(status__in=[Run.Status.QUEUED, Run.Status.RUNNING], cancel_requested=False)
        .filter(trials__status=Trial.Status.QUEUED, trials__dispatched_at__isnull=True)
        .values_list("pk", flat=True)
        .distinct()
    )
    for run_id in runs:
        after_trial(run_id)
    return reaped


def _append_event(trial_id: int, kind: str, data: dict) -> None:
    last = TrialEvent.objects.filter(trial_id=trial_id).order_by("-seq").values_list("seq", flat=True).first()
    TrialEvent.objects.create(trial_id=trial_id, seq=(last or 0) + 1, at=timezone.now(), kind=kind, data=data)
