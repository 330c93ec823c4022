"""Run control in plain Python: who may control a run, dispatch with per-run concurrency,
executing a worker's trials, finishing, cancel, retry, resume and the lease reaper.

The Celery tasks in tasks.py only call these. Messages to the workers are sent by task name
(`send_task`), so this module never imports the tasks that import it.

Finishing a run happens in two steps so the run's row lock is never held while its summary is
computed: the last trial's recount (under the lock) sees nothing pending; the suites and gates
are then judged with the lock released, and a second short locked write stores them with the
final status, unless a retry reopened the run meanwhile. So `is_final` always comes with its
gates.
"""

import logging
import time
from collections.abc import Sequence
from datetime import timedelta
from functools import partial

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.db.models import Count, F
from django.db.models.functions import Substr
from django.utils import timezone
from kombu.exceptions import KombuError

from evalsite.versioning import container_queue, host_queue, trial_queue, worker_queues
from runs_app import live, written
from runs_app.analysis import rollup
from runs_app.analysis.load import run_facts
from runs_app.analysis.stats import gates
from runs_app.engine import runner, suite_hooks
from runs_app.engine.suites import evaluate_suites
from runs_app.models import Run, Trial, TrialEvent, Worker

logger = logging.getLogger(__name__)

EXECUTE_TRIAL = "runs_app.tasks.execute_trial"
DISPATCH_RUN = "runs_app.tasks.dispatch_run"
HOLD_SUITE = "runs_app.tasks.hold_suite"
ALERT_RUN = "runs_app.tasks.alert_run"
# How long a worker process keeps running reserved trials of one run before it goes back to
# the broker (where other runs' trials wait their turn).
CHAIN_SECONDS = 2.0
# Who controls a run from a terminal (`evalrun --resume`): the machine's operator, not a user.
COMMAND_LINE = "the command line"
# Errors are grouped by category and the first this many characters of their message.
ERROR_GROUP_CHARS = 200


class ControlRefused(Exception):
    """This run cannot be controlled this way: `forbidden` (403) or not now (409)."""

    def __init__(self, message: str, *, forbidden: bool = False):
        self.forbidden = forbidden
        super().__init__(message)


def ensure_controllable(run: Run, user) -> None:
    """The one rule for cancel, retry and resume: the person who started the run, or staff (or
    the command line); never a historical (imported) run, which is read-only."""
    allowed = (
        user is COMMAND_LINE
        or user.is_staff
        or (run.started_by_id is not None and run.started_by_id == user.pk)
    )
    if not allowed:
        raise ControlRefused(
            "only the person who started this run, or staff, may cancel, retry or resume it", forbidden=True
        )
    if run.historical:
        raise ControlRefused(f"run {run.pk} was imported from coder-eval and is read-only")


def enqueue_dispatch(run_id: int) -> None:
    send(DISPATCH_RUN, (run_id,))


def send(task: str, args: tuple, queue: str | None = None, trial_id: int | None = None) -> bool:
    """Send a message to the workers. While the broker cannot be reached, the run's rows already
    say what is to be done: a trial's send is forgotten (`dispatched_at` cleared) and the
    reaper's next pass, once the broker is back, sends it again; a launch's dispatch is found
    by the same pass (a run with queued trials never sent). So an outage of the broker delays
    work and loses none; pages say the broker is unreachable."""
    try:
        current_app.send_task(task, args=args, queue=queue)
        return True
    except (KombuError, OSError) as exc:
        logger.warning(
            "broker unreachable: %s%s not sent (%s); the reaper sends it once it is back", task, args, exc
        )
        if trial_id is not None:
            Trial.objects.filter(pk=trial_id, status=Trial.Status.QUEUED).update(dispatched_at=None)
        return False


# --- dispatching and executing ------------------------------------------------------------------


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
        run = Run.objects.select_for_update().defer(*Run.BULKY_FIELDS).filter(pk=run_id).first()
        if run is None:
            return None
        return _dispatch_locked(run, reserve)


def _dispatch_locked(run: Run, reserve: bool) -> int | None:
    """dispatch() for a run whose row the current transaction has locked."""
    if run.cancel_requested or run.is_final or run.historical:
        return None
    if run.suite_status == Run.Suite.PENDING:  # its suite first, on whichever worker takes it
        transaction.on_commit(partial(send, HOLD_SUITE, (run.pk,), trial_queue_of(run)))
        return None
    if run.suite_status in (Run.Suite.SETTING_UP, Run.Suite.FAILED):
        return None
    # Every trial's end fills its slot: these statements are written out (`written`), as the
    # claim is.
    free = run.max_parallel - written.trials_holding_a_slot(run.pk)
    if free <= 0:
        return None
    ids = written.next_to_send(run.pk, free)
    if ids:
        written.update(
            Trial, {"dispatched_at": timezone.now()}, f"id IN ({', '.join(['%s'] * len(ids))})", ids
        )
    reserved = ids.pop(0) if reserve and ids else None
    queue = trial_queue_of(run) if ids else None  # a container run's costs a query: only when sending
    for trial_id in ids:
        transaction.on_commit(partial(send, EXECUTE_TRIAL, (trial_id,), queue, trial_id))
    return reserved


def alive_since(now=None):
    """A worker is alive while its last heartbeat is younger than three beats."""
    return (now or timezone.now()) - timedelta(seconds=3 * settings.WORKER_HEARTBEAT_SECONDS)


def live_workers(now=None):
    return Worker.objects.filter(last_seen_at__gte=alive_since(now))


def may_take(run: Run, worker: Worker) -> bool:
    """Whether this worker receives the run's trials: it consumes the shared queue and its own
    code version's, each also for its own host, and their container copies if it runs containers."""
    containers = bool((worker.capabilities or {}).get("containers"))
    return trial_queue_of(run) in worker_queues(worker.code_version, worker.hostname, containers)


def container_workers(now=None):
    """The live workers that take container trials."""
    return live_workers(now).filter(capabilities__containers=True)


def trial_queue_of(run: Run) -> str:
    """Where a run's trials are sent: the queue of its code version's workers, or the shared
    queue for a run that accepts any version (and for runs recorded before versions were); its
    container copy, which only workers that run containers take, for a run with container tasks;
    only the suite's host's workers', once a suite is set up there.

    A run with any container task goes to container workers whole: its suite and its trials
    share one host, and those workers run the namespace-sandbox trials as well."""
    queue = trial_queue(run.code_version)
    if run.any_code_version or not run.code_version:
        queue = settings.CELERY_TASK_DEFAULT_QUEUE
    if needs_containers(run):
        queue = container_queue(queue)
    if run.suite_status == Run.Suite.READY and run.suite_host:
        return host_queue(queue, run.suite_host)
    return queue


def needs_containers(run: Run) -> bool:
    """Whether a run has container tasks: its launch froze `needs_containers` in its config
    (read alone when the config was left unloaded, as dispatch leaves it)."""
    if "config" in run.get_deferred_fields():
        return Run.objects.filter(pk=run.pk, config__needs_containers=True).exists()
    return bool((run.config or {}).get("needs_containers"))


def hold_suite(run_id: int, worker: str) -> bool:
    """Set the run's suite hooks up on this worker's host and hold them, in a thread of this
    process, until teardown (`engine.suite_hooks`); False when another worker has them."""
    if not suite_hooks.claim(run_id, worker):
        return False
    live.publish(run_id)
    holder = suite_hooks.SuiteHolder(
        run_id, worker, on_ready=lambda run, _: dispatch(run), on_failed=_suite_failed
    )
    holder.start()
    return True


def _suite_failed(run_id: int, why: str) -> None:
    """The suite could not be set up: every trial still waiting is an error (a failed hook is
    never a fail), and the run ends; its teardown runs all the same."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        Trial.objects.for_run(run).current().filter(status=Trial.Status.QUEUED).update(
            status=Trial.Status.ERROR, finished_at=timezone.now(), error_category="hook",
            error_message=f"hooks.suite.setup failed: {why}"[:10_000],
        )  # fmt: skip
        rollup.recount(run)
        live.publish(run_id)
    logger.warning("run %s: its suite failed: %s", run_id, why)
    refresh_run(run_id)


def release(trial_id: int) -> None:
    """Give back a reserved trial the worker could not claim, so it is dispatched normally."""
    run_id = Trial.objects.filter(pk=trial_id).values_list("run_id", flat=True).first()
    Trial.objects.filter(pk=trial_id, status=Trial.Status.QUEUED).update(dispatched_at=None)
    if run_id is not None:
        dispatch(run_id)


def execute(trial_id: int, worker: str) -> str | None:
    """Run a trial to a final state, then, for a short while, further trials of the same run
    reserved by dispatch (no broker round trip between them). Returns the first trial's final
    status, or None when it was not ours to run (taken by another worker, or already ended)."""
    chain_until = time.monotonic() + CHAIN_SECONDS
    if not runner.claim(trial_id, worker):
        return None
    status, next_id = _run_claimed(trial_id, worker, reserve=True)
    while next_id is not None:
        if not runner.claim(next_id, worker):
            release(next_id)
            break
        _, next_id = _run_claimed(next_id, worker, reserve=time.monotonic() < chain_until)
    return status


class _AfterStored:
    """What follows a stored outcome, in the transaction that stores it (the run's row is
    locked there already): count it, stop a failing run, fill the freed slot (reserving the
    next trial when asked) or mark the run for finishing. One transaction a trial, not two."""

    def __init__(self, reserve: bool):
        self.reserve = reserve
        self.stored = self.finish = False
        self.next_id: int | None = None

    def __call__(self, run: Run, trial: Trial, criteria) -> None:
        rollup.add_finished(run, trial, criteria)
        self.stored = True
        self.next_id, self.finish = _follow_up(run, self.reserve)


def _run_claimed(trial_id: int, worker: str, reserve: bool) -> tuple[str | None, int | None]:
    """Run a claimed trial; returns its stored status and the reserved trial to run next."""
    after = _AfterStored(reserve)
    status, run_id = runner.run_claimed(trial_id, worker, after)
    if not after.stored:  # the lease was lost: the trial's new owner counts it
        return status, after_trial(run_id, (), reserve=reserve)
    if after.finish:
        finish_run(run_id)
    return status, after.next_id


def error_groups(run: Run, limit: int = 10) -> list[dict]:
    """The run's errored trials grouped by category and the start of the message, most first."""
    return list(
        Trial.objects.for_run(run)
        .current()
        .filter(status=Trial.Status.ERROR)
        .annotate(message=Substr("error_message", 1, ERROR_GROUP_CHARS))
        .values("error_category", "message")
        .annotate(n=Count("pk"))
        .order_by("-n", "error_category", "message")[:limit]
    )


def _fail_fast(run: Run) -> None:
    """Stop a run whose trials all end in the same error before any is graded (the caller holds
    the run's row lock): K identical errors and no pass or fail yet."""
    threshold = settings.FAIL_FAST_AFTER
    if not threshold or run.cancel_requested or run.n_error < threshold or run.n_passed + run.n_failed:
        return
    top = error_groups(run, limit=1)
    if not top or top[0]["n"] < threshold:
        return
    group = top[0]
    message = group["message"].splitlines()[0] if group["message"] else ""
    run.stop_reason = (
        f"stopped early: {group['n']} trials ended in the same error before any trial was graded "
        f"({group['error_category'] or 'error'}: {message}). Fix it, then resume or re-run "
        f"(FAIL_FAST_AFTER={threshold} sets how many)"
    )
    run.cancel_requested = True
    run.save(update_fields=["stop_reason", "cancel_requested"])
    Trial.objects.for_run(run).current().filter(status=Trial.Status.QUEUED).update(
        status=Trial.Status.CANCELLED, finished_at=timezone.now(), error_category="fail_fast"
    )
    rollup.recount(run)
    logger.warning("run %s: %s", run.pk, run.stop_reason)


# --- finishing ------------------------------------------------------------------------------------


def _nothing_left(run: Run) -> bool:
    return not run.is_final and run.n_queued + run.n_running == 0 and run.n_trials > 0


def after_trial(run_id: int, trial_ids: Sequence[int] | None = None, reserve: bool = False) -> int | None:
    """Called when trials of the run reached a final state: fill the freed slots or finish the
    run. A trial stored by the runner was counted as it was stored (`rollup.add_finished`);
    `trial_ids` names trials changed otherwise (the reaper), whose units are regrouped and the
    run recounted (None, the default: every unit; empty: nothing to recount). Returns a
    reserved trial to run next when `reserve` is asked (see dispatch)."""
    with transaction.atomic():
        run = Run.objects.select_for_update().defer(*Run.BULKY_FIELDS).get(pk=run_id)
        if trial_ids is None or trial_ids:
            rollup.recount(run, trial_ids)
        live.publish(run_id)
        next_id, finish = _follow_up(run, reserve)
    if finish:
        finish_run(run_id)
    return next_id


def _follow_up(run: Run, reserve: bool) -> tuple[int | None, bool]:
    """With the run's row locked and its counts current: stop it if it fails fast, then fill
    its free slots, returning the trial reserved for the caller, or say that nothing is left
    (the caller finishes the run once the lock is released)."""
    _fail_fast(run)
    if _nothing_left(run):
        return None, True
    return _dispatch_locked(run, reserve), False


def refresh_run(run_id: int) -> Run:
    """Recount the run from its trials and finish it when nothing is pending."""
    with transaction.atomic():
        # Locked, so two workers finishing at once cannot write a stale count last.
        run = Run.objects.select_for_update().get(pk=run_id)
        rollup.recount(run)
        live.publish(run_id)
    if _nothing_left(run):
        return finish_run(run_id)
    return run


def finish_run(run_id: int) -> Run:
    """Judge the suites and gates of a run with nothing pending (no lock held), then store them
    with the final status in one short locked write."""
    run = Run.objects.get(pk=run_id)
    suite_results = evaluate_suites(run)
    gate_results = _judge_gates(run, suite_results)
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        if run.is_final or Trial.objects.for_run(run).current().pending().exists():
            return run  # finished by another worker, or reopened by a retry meanwhile
        run.status = Run.Status.CANCELLED if run.cancel_requested else Run.Status.FINISHED
        run.finished_at = timezone.now()
        run.suite_results = suite_results
        run.gate_results = gate_results
        run.gates_passed = gates.all_passed(gate_results)
        run.save(update_fields=["status", "finished_at", "suite_results", "gate_results", "gates_passed"])
        live.publish(run_id)
        if run.schedule_id is not None:  # its gates decide whether its schedule alerts
            transaction.on_commit(partial(current_app.send_task, ALERT_RUN, args=(run_id,)))
    logger.info("run %s %s: %s passed, %s failed, %s errors", run.pk, run.status, run.n_passed,
                run.n_failed, run.n_error)  # fmt: skip
    return run


def rejudge_run(run_id: int) -> Run:
    """Recount an ended run and judge its suites and gates again (after `evaluate` re-graded
    some of its trials); its status and end time stay."""
    with transaction.atomic():  # regrouped first: the gates read the tallies
        run = Run.objects.select_for_update().get(pk=run_id)
        rollup.recount(run)
    suite_results = evaluate_suites(run)
    gate_results = _judge_gates(run, suite_results)
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        run.suite_results, run.gate_results = suite_results, gate_results
        run.gates_passed = gates.all_passed(gate_results)
        run.save(update_fields=["suite_results", "gate_results", "gates_passed"])
    return run


def _judge_gates(run: Run, suite_results: list[dict]) -> list[dict]:
    if not run.gates:
        return []
    try:
        facts = run_facts(run, suite_results, gates.clusterings(list(run.gates)))
        return gates.evaluate_gates(list(run.gates), facts)
    except Exception as exc:
        # The run must still finish; a gate nobody could judge counts as failed.
        logger.exception("run %s: gate evaluation crashed", run.pk)
        return gates.unjudged(list(run.gates), f"gate evaluation crashed: {exc!r}")


# --- cancel, retry, resume ------------------------------------------------------------------------


def cancel_run(run: Run, by) -> Run:
    """Stop dispatching, cancel what waits; running agents see the flag within half a second
    and are killed, their trials ending `cancelled`."""
    ensure_controllable(run, by)
    if run.is_final:
        raise ControlRefused(f"run {run.pk} has already ended ({run.status})")
    now = timezone.now()
    with transaction.atomic():
        Run.objects.filter(pk=run.pk).update(cancel_requested=True)
        Trial.objects.for_run(run).current().filter(status=Trial.Status.QUEUED).update(
            status=Trial.Status.CANCELLED, finished_at=now, error_category="cancelled"
        )
    return refresh_run(run.pk)


def retry_errors(run: Run, by) -> int:
    """New attempts for the run's errored trials (the old ones are kept); passed and failed
    trials never run again."""
    ensure_controllable(run, by)
    with transaction.atomic():
        errored = list(Trial.objects.select_for_update().filter(run=run, status=Trial.Status.ERROR).current())
        if not errored:
            return 0
        Trial.objects.filter(pk__in=[t.pk for t in errored]).update(is_latest=False)
        Trial.objects.bulk_create([_next_attempt(t) for t in errored])
        _reopen(run)
    dispatch(run.pk)
    return len(errored)


def resume_run(run: Run, by) -> int:
    """Finish a crashed or cancelled run: trials that never reached an outcome run again;
    passed, failed and errored trials are kept."""
    ensure_controllable(run, by)
    current = Trial.objects.for_run(run).current()
    with transaction.atomic():
        current.filter(status=Trial.Status.CANCELLED).update(
            status=Trial.Status.QUEUED, attempt=F("attempt") + 1, dispatched_at=None, finished_at=None,
            error_category="", error_message="",
        )  # fmt: skip
        # A crashed worker's trials: the reaper would return them once their lease expires;
        # resuming says the operator knows the worker is gone.
        current.filter(status=Trial.Status.RUNNING).update(
            status=Trial.Status.QUEUED, attempt=F("attempt") + 1, dispatched_at=None,
            lease_owner="", lease_expires_at=None,
        )  # fmt: skip
        current.filter(status=Trial.Status.QUEUED).update(dispatched_at=None)
        pending = current.filter(status=Trial.Status.QUEUED).count()
        _reopen(run)
    dispatch(run.pk)
    # With nothing left to run no trial will end to finish the run: finish it here.
    refresh_run(run.pk)
    return pending


def allow_any_code_version(run: Run, by) -> int:
    """Let workers of any code version run what is left of the run (its version's workers are
    gone after an upgrade); its queued trials are sent again, to the shared queue. Returns how
    many were waiting."""
    ensure_controllable(run, by)
    with transaction.atomic():
        Run.objects.filter(pk=run.pk).update(any_code_version=True)
        waiting = Trial.objects.for_run(run).current().filter(status=Trial.Status.QUEUED)
        count = waiting.update(dispatched_at=None)
    dispatch(run.pk)
    live.publish(run.pk)
    return count


def _reopen(run: Run) -> None:
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.RUNNING, cancel_requested=False, finished_at=None, stop_reason=""
    )
    # A suite already torn down is set up again (anew: its attempts start over).
    Run.objects.filter(pk=run.pk, suite_status__in=[Run.Suite.TORN_DOWN, Run.Suite.FAILED]).update(
        suite_status=Run.Suite.PENDING, suite_host="", suite_owner="", suite_dir="", suite_attempt=0,
        suite_error="",
    )  # fmt: skip
    live.publish(run.pk)
    run.refresh_from_db()
    rollup.recount(run)


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


# --- the reaper ------------------------------------------------------------------------------------


def holder_gone(expired_at, streaks: Sequence[tuple]) -> bool:
    """Whether a lease that ran out at `expired_at` lost its worker, rather than the database
    for a while. A database outage longer than a lease leaves every lease expired while their
    workers live, and each renews them within a second of reaching the database again. So a
    lease counts as lost only once some worker host has reached the database without a break
    for WORKER_HEARTBEAT_SECONDS after it ran out (two reports in a row: `streaks` holds each
    worker's (reachable_since, last_seen_at)). With no worker reporting at all, nothing is
    taken: nobody could run it, and the run page says no worker is there."""
    grace = timedelta(seconds=settings.WORKER_HEARTBEAT_SECONDS)
    return any(last - max(expired_at, since) >= grace for since, last in streaks)


def reap_expired_leases() -> int:
    """Put running trials whose worker died (lease expired, `holder_gone`) back in the queue,
    up to the attempt limit, then mark them `error`; re-dispatch queued trials whose message
    was lost."""
    now = timezone.now()
    runs: dict[int, list[int]] = {}
    reaped = 0
    expired = Trial.objects.filter(status=Trial.Status.RUNNING, lease_expires_at__lt=now)
    rows = expired.values_list(
        "pk", "run_id", "attempt", "lease_owner", "run__cancel_requested", "lease_expires_at"
    )
    streaks = _streaks(now)
    for trial_id, run_id, attempt, owner, cancelled, expired_at in rows:
        if not holder_gone(expired_at, streaks):
            continue
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
            runs.setdefault(run_id, []).append(trial_id)
            _append_event(trial_id, TrialEvent.Kind.SYSTEM, {"text": note})
            logger.warning("trial %s: %s", trial_id, note)
    waiting_for_suite = _reap_suites(now, streaks)
    stale = now - timedelta(seconds=settings.REDISPATCH_AFTER_SECONDS)
    lost = Trial.objects.current().filter(status=Trial.Status.QUEUED, dispatched_at__lt=stale)
    waiting = set(lost.values_list("run_id", flat=True).distinct())
    lost.update(dispatched_at=None)
    # Runs that still wait on work (e.g. every message of a killed worker was lost).
    waiting.update(
        Run.objects.filter(status__in=[Run.Status.QUEUED, Run.Status.RUNNING], cancel_requested=False)
        .filter(trials__status=Trial.Status.QUEUED, trials__dispatched_at__isnull=True)
        .values_list("pk", flat=True)
        .distinct()
    )
    for run_id in waiting | set(runs) | waiting_for_suite:
        after_trial(run_id, runs.get(run_id, ()))
    return reaped


def _streaks(now) -> list[tuple]:
    """(reachable_since, last_seen_at) of the workers heard from lately (`holder_gone`)."""
    recent = Worker.objects.filter(reachable_since__isnull=False, last_seen_at__gte=now - timedelta(days=1))
    return list(recent.values_list("reachable_since", "last_seen_at"))


def _reap_suites(now, streaks: Sequence[tuple]) -> set[int]:
    """Suites whose holder stopped renewing (its host died): set up again elsewhere, up to the
    attempt limit; a run that ended meanwhile just records that teardown never ran. Returns
    the runs to dispatch again."""
    again = set()
    expired = Run.objects.filter(
        suite_status__in=[Run.Suite.SETTING_UP, Run.Suite.READY], suite_lease_expires_at__lt=now
    )
    rows = expired.values_list("pk", "suite_owner", "suite_attempt", "status", "suite_lease_expires_at")
    for run_id, owner, attempt, status, expired_at in rows:
        if not holder_gone(expired_at, streaks):
            continue
        still = Run.objects.filter(pk=run_id, suite_owner=owner, suite_lease_expires_at__lt=now)
        lost = f"the worker holding the suite ({owner}) stopped renewing its lease"
        if status in (Run.Status.FINISHED, Run.Status.CANCELLED):
            still.update(suite_status=Run.Suite.TORN_DOWN, suite_error=f"{lost} before teardown ran")
        elif attempt < settings.TRIAL_MAX_ATTEMPTS:
            if still.update(suite_status=Run.Suite.PENDING, suite_host="", suite_owner="", suite_dir=""):
                logger.warning("run %s: %s; setting it up again", run_id, lost)
                again.add(run_id)
        elif still.update(suite_status=Run.Suite.FAILED, suite_error=f"{lost}, on its last attempt"):
            _suite_failed(run_id, f"{lost}, on its last attempt (TRIAL_MAX_ATTEMPTS)")
    return again


def _append_event(trial_id: int, kind: str, data: dict) -> None:
    last = TrialEvent.objects.filter(trial_id=trial_id).order_by("-seq").values_list("seq", flat=True).first()
    TrialEvent.objects.create(trial_id=trial_id, seq=(last or 0) + 1, at=timezone.now(), kind=kind, data=data)
