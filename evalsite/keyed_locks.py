"""One lock per key, for work that many threads ask for at once (a hundred live pages woken by the
same change): the first computes, the others wait for it and then find its result (pure Python)."""

import threading
from collections.abc import Hashable


class KeyedLocks:
    """`locks(key)` is the lock of `key`. Past `limit` keys they are all dropped (a thread still
    holding one finishes normally; a new asker gets a new lock, at worst computing twice)."""

    def __init__(self, limit: int = 1024) -> None:
        self._locks: dict[Hashable, threading.Lock] = {}
        self._guard = threading.Lock()
        self._limit = limit

    def __call__(self, key: Hashable) -> threading.Lock:
        with self._guard:
            lock = self._locks.get(key)
            if lock is None:
                if len(self._locks) >= self._limit:
                    self._locks.clear()
                lock = self._locks[key] = threading.Lock()
            return lock
