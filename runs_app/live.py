"""Live updates: a change to a run or a trial is published once, and one listener per web process
wakes every open page that shows it (no page polls the database).

`publish(run_id, trial_id)` is called by whoever changed the row, after the change commits:

- on PostgreSQL, `NOTIFY evalsite_live, 'RUN:TRIAL'` in the writer's transaction (delivered at
  commit; a rolled-back change notifies nobody). The listener holds one connection in LISTEN.
- on the embedded default (SQLite, one host), a touch of `VAR_DIR/live/run-RUN` (and `trial-TRIAL`
  for a trial page): the listener stats the files its pages watch, ten times a second, reading no
  database.

`hub().wait(key, timeout)` (async, ASGI) or `hub().wait_sync(key, timeout)` (WSGI) returns
when the key ("run:42", "trial:7") changed after the call began, or on timeout (False).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import defaultdict
from pathlib import Path

from django.conf import settings
from django.db import connection, transaction

logger = logging.getLogger(__name__)

CHANNEL = "evalsite_live"
FILE_POLL_SECONDS = 0.1


def publish(run_id: int, trial_id: int | None = None) -> None:
    """Tell the pages of this run (and trial) that something changed, once the change commits."""
    if connection.vendor == "postgresql":
        payload = f"{run_id}:{trial_id or ''}"
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, payload])
        return
    transaction.on_commit(lambda: _touch(run_id, trial_id))


def _touch(run_id: int, trial_id: int | None) -> None:
    folder = live_dir()
    for name in [f"run-{run_id}", *([f"trial-{trial_id}"] if trial_id else [])]:
        path = folder / name
        try:
            path.touch()  # (an existing file: its mtime, which the listener watches)
        except OSError:  # a page that misses one change catches up on its keep-alive check
            logger.debug("live: cannot touch %s", path, exc_info=True)


def live_dir() -> Path:
    folder = Path(settings.VAR_DIR) / "live"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class Hub:
    """The web process's one listener, and the pages waiting on it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._versions: dict[str, int] = defaultdict(int)
        self._changed = threading.Condition(self._lock)
        self._async_waiters: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = defaultdict(
            set
        )
        self._watched: dict[str, int] = defaultdict(int)  # key -> pages watching it (file backend)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    def stop(self) -> None:
        """End the listener (and its LISTEN connection); the next wait starts a new one."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._thread = None
        self._stopping = threading.Event()

    # --- waiting (pages) --------------------------------------------------------------------

    def version(self, key: str) -> int:
        self._ensure_listening()
        with self._lock:
            return self._versions[key]

    def wait_sync(self, key: str, timeout: float, since: int | None = None) -> bool:
        self._ensure_listening()
        with self._changed:
            start = self._versions[key] if since is None else since
            self._watched[key] += 1
            try:
                return self._changed.wait_for(lambda: self._versions[key] != start, timeout)
            finally:
                self._watched[key] -= 1

    async def wait(self, key: str, timeout: float, since: int | None = None) -> bool:
        self._ensure_listening()
        event = asyncio.Event()
        waiter = (asyncio.get_running_loop(), event)
        with self._lock:
            if since is not None and self._versions[key] != since:
                return True
            self._async_waiters[key].add(waiter)
            self._watched[key] += 1
        try:
            await asyncio.wait_for(event.wait(), timeout)
            return True
        except TimeoutError:
            return False
        finally:
            with self._lock:
                self._async_waiters[key].discard(waiter)
                self._watched[key] -= 1

    def changed(self, key: str) -> None:
        """A change arrived (from the listener; tests may call it)."""
        with self._changed:
            self._versions[key] += 1
            waiters = list(self._async_waiters.get(key, ()))
            self._changed.notify_all()
        for loop, event in waiters:
            loop.call_soon_threadsafe(event.set)

    # --- listening ----------------------------------------------------------------------------

    def _ensure_listening(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            target = self._listen_postgres if connection.vendor == "postgresql" else self._listen_files
            self._thread = threading.Thread(target=target, name="live-listener", daemon=True)
            self._thread.start()

    def _listen_postgres(self) -> None:
        import psycopg

        params = connection.get_connection_params()
        failed = False
        while not self._stopping.is_set():
            try:
                with psycopg.connect(**params, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    if failed:  # back after an outage: every page catches up on what it missed
                        logger.warning("live: listening again")
                        self._wake_all()
                        failed = False
                    while not self._stopping.is_set():
                        for note in conn.notifies(timeout=1.0):
                            run, _, trial = note.payload.partition(":")
                            self.changed(f"run:{run}")
                            if trial:
                                self.changed(f"trial:{trial}")
            except Exception as exc:  # a restarted or unreachable database: listen again
                if not failed:
                    logger.warning("live: the LISTEN connection failed (%s); reconnecting every second", exc)
                    self._wake_all()  # their checks say what they can
                failed = True
                self._stopping.wait(1.0)

    def _wake_all(self) -> None:
        with self._lock:
            keys = list(self._versions)
        for key in keys:
            self.changed(key)

    def _listen_files(self) -> None:
        seen: dict[str, int] = {}
        folder = live_dir()
        while not self._stopping.is_set():
            with self._lock:
                keys = [key for key, count in self._watched.items() if count > 0]
            for key in keys:
                kind, _, ident = key.partition(":")
                try:
                    stamp = (folder / f"{kind}-{ident}").stat().st_mtime_ns
                except OSError:
                    stamp = 0  # nothing published yet: its first touch is a change
                if seen.get(key) not in (None, stamp):
                    self.changed(key)
                seen[key] = stamp
            self._stopping.wait(FILE_POLL_SECONDS)


_hub: Hub | None = None
_hub_lock = threading.Lock()


def hub() -> Hub:
    global _hub
    with _hub_lock:
        if _hub is None:
            _hub = Hub()
        return _hub
