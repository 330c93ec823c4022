"""Django's SQLite backend, with the write transactions of one process taken in turn.

SQLite lets one writer in at a time and makes the others poll (a busy handler that sleeps up to
100 ms between tries). A worker running hundreds of trials in threads (WORKER_SLOTS) turned
that into a convoy: with 256 slots, trials waited past the 20 s timeout and ended "database is
locked". Threads of one process now queue on a lock around BEGIN IMMEDIATE ... COMMIT, handed
to one waiter at a time; between processes SQLite's own lock and timeout still apply.
"""

import threading

from django.db.backends.sqlite3 import base

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock_for(name: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(name, threading.Lock())


class DatabaseWrapper(base.DatabaseWrapper):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._holds_write_lock = False

    def _start_transaction_under_autocommit(self):
        lock = _lock_for(str(self.settings_dict["NAME"]))
        lock.acquire()
        self._holds_write_lock = True
        try:
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
            _lock_for(str(self.settings_dict["NAME"])).release()
