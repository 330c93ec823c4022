"""Django's SQLite backend, with write transactions taken in turn, by threads and by processes.

SQLite lets one writer in at a time and makes the others poll (a busy handler that sleeps up to
100 ms between tries). A worker running hundreds of trials in threads (WORKER_SLOTS) turned
that into a convoy: with 256 slots, trials waited past the 20 s timeout and ended "database is
locked". Between processes the same polling slept ~10 ms at a time whenever two worker
processes wrote at once: two processes of trivial trials ran at a third of one process's pace.

So BEGIN IMMEDIATE ... COMMIT is taken under a lock that hands the turn to the next waiter the
moment it is released: a thread lock within a process, then an flock on a file beside the
database between processes (the kernel wakes the waiter; nobody sleeps on a timer). Writes
outside a transaction (autocommit) still meet SQLite's own lock and timeout.
"""

import fcntl
import os
import threading
from pathlib import Path

from django.db.backends.sqlite3 import base

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()
# (pid, database) -> an open lock file: flock belongs to the open file, which a forked child
# would share with its parent, so each process opens its own.
_files: dict[tuple[int, str], int] = {}


def _lock_for(name: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(name, threading.Lock())


def _lock_file(name: str) -> int | None:
    """The descriptor of the database's write-lock file in this process (None for an in-memory
    or unwritable database: SQLite's own locking still applies)."""
    key = (os.getpid(), name)
    with _locks_guard:
        if key not in _files:
            if name.startswith(":memory:") or name.startswith("file:") or not Path(name).parent.is_dir():
                return None
            try:
                _files[key] = os.open(f"{name}.writelock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError:
                return None
        return _files[key]


class DatabaseWrapper(base.DatabaseWrapper):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._holds_write_lock = False

    def _start_transaction_under_autocommit(self):
        name = str(self.settings_dict["NAME"])
        _lock_for(name).acquire()
        self._holds_write_lock = True
        try:
            if (descriptor := _lock_file(name)) is not None:
                fcntl.flock(descriptor, fcntl.LOCK_EX)
            super()._start_transaction_under_autocommit()
        except BaseException:
            self._release_write_lock()
            raise

    def _commit(self):
        try:
            super()._commit()
        finally:
            self._release_write_lock()

    def _rollback(self):
        try:
            super()._rollback()
        finally:
            self._release_write_lock()

    def _close(self):
        try:
            super()._close()
        finally:
            self._release_write_lock()

    def _release_write_lock(self):
        if self._holds_write_lock:
            self._holds_write_lock = False
            name = str(self.settings_dict["NAME"])
            if (descriptor := _lock_file(name)) is not None:
                fcntl.flock(descriptor, fcntl.LOCK_UN)
            _lock_for(name).release()
