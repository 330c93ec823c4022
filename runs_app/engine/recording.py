"""A trial's events: buffered, redacted, capped, and written in small batches while the worker
still holds the trial's lease."""

import logging
import time
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, transaction
from django.utils import timezone

from evalsite.db import drop_connection
from runs_app import live, written
from runs_app.engine import sandbox
from runs_app.engine.leases import Heartbeat, release_connection
from runs_app.models import Trial, TrialEvent

logger = logging.getLogger(__name__)

FLUSH_EVERY_SECONDS = 0.5


class Recorder:
    """Buffers a trial's events and writes them in small batches (capped per trial)."""

    def __init__(
        self,
        trial_id: int,
        secrets: list[str],
        first_attempt: bool = False,
        run_id: int | None = None,
        lease: Heartbeat | None = None,
    ):
        self.trial_id, self.run_id = trial_id, run_id
        self.secrets = secrets
        # Events are written only while this worker holds the trial's lease: a host cut off from
        # the database that comes back after its trial went to another host writes nothing to it.
        self.lease = lease
        # A first attempt has no events yet (the reaper only writes to re-queued trials).
        last = (
            0
            if first_attempt
            else (
                TrialEvent.objects.filter(trial_id=trial_id)
                .order_by("-seq")
                .values_list("seq", flat=True)
                .first()
            )
        )
        self.seq = last or 0
        self.count = 0
        self.dropped = 0
        self.buffer: list[TrialEvent] = []
        self.last_flush = time.monotonic()
        self.unwritten_since = 0.0  # monotonic time of the first write the database refused

    def add(self, kind: str, data: dict[str, Any]) -> None:
        if self.count >= settings.TRIAL_EVENT_CAP:
            self.dropped += 1
            return
        self.count += 1
        self.seq += 1
        data = redact(data, self.secrets)
        self.buffer.append(
            TrialEvent(trial_id=self.trial_id, seq=self.seq, at=timezone.now(), kind=kind, data=data)
        )
        self.flush_if_due()

    def flush_if_due(self) -> None:
        """Write what waited FLUSH_EVERY_SECONDS since the last write (also called while a
        command runs, so a long step shows on the trial page without a write per event)."""
        if self.buffer and time.monotonic() - self.last_flush >= FLUSH_EVERY_SECONDS:
            self.flush()

    def phase(self, name: str, flush: bool = False, **data: Any) -> None:
        """A phase change; `flush` writes it at once (the run page shows it live)."""
        self.add(TrialEvent.Kind.PHASE, {"phase": name, **data})
        if flush:
            self.flush()

    def flush(self, fenced: bool = False) -> bool:
        """Write the buffered events; True when there were some and their pages were told.
        `fenced`: the caller's transaction has just checked the lease (storing the outcome).
        While the database cannot be reached the events stay buffered (up to the cap) and the
        trial goes on: they are written with the outcome, which the worker reports once the
        database is back (`runner.TrialExecution.persist`)."""
        if fenced or connection.in_atomic_block:
            return self._flush(fenced)
        try:
            return self._flush(fenced)
        except (OperationalError, InterfaceError) as exc:
            if not self.unwritten_since:
                logger.warning("trial %s: events kept until the database answers (%s)", self.trial_id, exc)
                self.unwritten_since = time.monotonic()
            drop_connection()
            self.last_flush = time.monotonic()
            return False

    def _flush(self, fenced: bool) -> bool:
        wrote = bool(self.buffer)
        if wrote:
            # The events and their notice commit together (a notice outside the transaction was
            # a commit of its own); inside the outcome's transaction, as part of it.
            with transaction.atomic(savepoint=False):
                if not fenced and not self._lease_held():
                    self.buffer = []
                    return False
                written.insert(TrialEvent, self.buffer, ("trial", "seq", "at", "kind", "data"))
                if self.run_id is not None:  # the trial page streams its transcript
                    live.publish(self.run_id, self.trial_id)
            self.buffer = []
            release_connection()
        self.last_flush = time.monotonic()
        self.unwritten_since = 0.0
        return wrote and self.run_id is not None

    def _lease_held(self) -> bool:
        """Whether this worker still holds the trial, with its row locked until the events are in
        (the reaper's re-queue waits for them, or they wait for it and are not written)."""
        if self.lease is None:
            return True
        held = written.fetch(
            Trial, "id = %s AND status = %s AND lease_owner = %s",
            [self.trial_id, Trial.Status.RUNNING, self.lease.worker], ("id",), lock=True,
        )  # fmt: skip
        if held:
            return True
        logger.warning("trial %s: lease lost; events from %s not kept", self.trial_id, self.lease.worker)
        self.lease.lease_lost.set()
        return False


def redact(value: Any, secrets: list[str]) -> Any:
    """What an agent wrote, made safe to store: secret values replaced (they never reach the
    database: not in events, output or criterion details) and NUL characters, which PostgreSQL
    text cannot hold, replaced by U+FFFD."""
    if isinstance(value, str):
        value = value.replace("\x00", "\ufffd")
        return sandbox.redact(value, secrets) if secrets else value
    if isinstance(value, dict):
        return {redact(key, secrets): redact(item, secrets) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [redact(item, secrets) for item in value]
    return value
