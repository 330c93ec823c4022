"""A worker process's hold on the trials it runs: one lease keeper thread for all of them, each
trial's view of it (cancelled? lease lost?), and giving a pooled connection back before a wait."""

import logging
import os
import threading
import time
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, connection
from django.utils import timezone

from evalsite.db import drop_connection
from runs_app.models import Run, Trial

logger = logging.getLogger(__name__)


def release_connection() -> None:
    """Give this thread's database connection back before a wait (a command, an agent's next
    line) when the worker runs many trials in threads (WORKER_SLOTS): their connections come
    from a small pool, and a trial waiting on its agent must not hold one. A prefork worker
    keeps its one connection: reconnecting per command would cost more than it saves; so does
    SQLite's, which is a file, not a server's slot."""
    if (
        settings.WORKER_SLOTS
        and "pool" in connection.settings_dict["OPTIONS"]
        and not connection.in_atomic_block
    ):
        connection.close()


class Heartbeat:
    """One trial's view of its process's lease keeper: whether its run was cancelled or its
    lease lost (reaped while we looked dead, or finished elsewhere)."""

    def __init__(self, trial: Trial, worker: str):
        self.trial_id, self.run_id, self.worker = trial.pk, trial.run_id, worker
        self.cancelled = threading.Event()
        self.lease_lost = threading.Event()

    def start(self) -> None:
        LeaseKeeper.shared().add(self)

    def stop(self) -> None:
        LeaseKeeper.shared().remove(self)

    def stop_reason(self) -> str | None:
        if self.lease_lost.is_set():
            return "lease_lost"
        if self.cancelled.is_set():
            return "cancelled"
        return None


class LeaseKeeper(threading.Thread):
    """One thread per worker process for all the trials it runs, however many run at once:
    twice a second one query reads which of their runs were cancelled, and every third of the
    lease one UPDATE renews their leases (a trial's own heartbeat thread would cost a thread
    and two queries a second per trial in flight)."""

    _instance: "LeaseKeeper | None" = None
    _instance_lock = threading.Lock()

    def __init__(self) -> None:
        super().__init__(daemon=True, name="lease-keeper")
        self.beats: set[Heartbeat] = set()
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.pid = os.getpid()

    @classmethod
    def shared(cls) -> "LeaseKeeper":
        with cls._instance_lock:
            # A forked pool process inherits the object but not the thread: start its own.
            if cls._instance is None or cls._instance.pid != os.getpid():
                cls._instance = cls()
                cls._instance.start()
            return cls._instance

    def add(self, beat: Heartbeat) -> None:
        with self.lock:
            self.beats.add(beat)

    def remove(self, beat: Heartbeat) -> None:
        with self.lock:
            self.beats.discard(beat)

    def run(self) -> None:
        renew_every = settings.TRIAL_LEASE_SECONDS / 3
        next_renewal = time.monotonic() + renew_every
        unreachable = False
        while not self.stopping.wait(0.5):
            with self.lock:
                beats = list(self.beats)
            if not beats:
                connection.close()  # idle: hold no connection
                continue
            try:
                self._check_cancelled(beats)
                if time.monotonic() >= next_renewal:
                    # After an outage at once: the reaper waits for this host to have been
                    # back a few seconds before it takes a trial whose lease ran out meanwhile.
                    self._renew(beats)
                    next_renewal = time.monotonic() + renew_every
            except DatabaseError as exc:
                # A busy or restarting database must not end the heartbeat: the next tick tries
                # again, well before the leases run out (and at once when it is back).
                if not unreachable:
                    logger.warning(
                        "lease keeper: no database for %d trials (%s); trying every 0.5 s", len(beats), exc
                    )
                unreachable = True
                drop_connection()
                continue
            if unreachable:
                logger.warning("lease keeper: the database answers again (%d trials)", len(beats))
                unreachable = False

    def _check_cancelled(self, beats: list[Heartbeat]) -> None:
        runs = {beat.run_id for beat in beats}
        cancelled = set(Run.objects.filter(pk__in=runs, cancel_requested=True).values_list("pk", flat=True))
        for beat in beats:
            if beat.run_id in cancelled:
                beat.cancelled.set()

    def _renew(self, beats: list[Heartbeat]) -> None:
        expires = timezone.now() + timedelta(seconds=settings.TRIAL_LEASE_SECONDS)
        by_worker: dict[str, list[Heartbeat]] = {}
        for beat in beats:
            by_worker.setdefault(beat.worker, []).append(beat)
        for worker, group in by_worker.items():
            ids = [beat.trial_id for beat in group]
            held = Trial.objects.filter(pk__in=ids, status=Trial.Status.RUNNING, lease_owner=worker)
            if held.update(lease_expires_at=expires) == len(ids):
                continue
            still = set(held.values_list("pk", flat=True))
            for beat in group:
                if beat.trial_id not in still:
                    beat.lease_lost.set()  # reaped, or finished elsewhere: stop working
