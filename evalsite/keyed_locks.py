"""Work that many threads ask for at once (a hundred live pages woken by the same change, a team's
viewers of the same list): the first computes, the others wait for it and then find its result
(pure Python).

A thread about to wait for another's computation first calls `before_wait`: the web passes a
function that gives the thread's pooled database connection back. The computing thread may need
a connection of that pool; with every connection held by threads waiting for it, it would wait
for the pool's timeout (10 s) and every waiter would fail (the overload of issue 31).
"""

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any


class KeyedLocks:
    """`with locks(key):` holds the lock of `key`. Past `limit` keys they are all dropped (a
    thread still holding one finishes normally; a new asker gets a new lock, at worst computing
    twice)."""

    def __init__(self, limit: int = 1024, before_wait: Callable[[], None] | None = None) -> None:
        self._locks: dict[Hashable, threading.Lock] = {}
        self._guard = threading.Lock()
        self._limit = limit
        self._before_wait = before_wait

    @contextmanager
    def __call__(self, key: Hashable) -> Iterator[None]:
        with self._guard:
            lock = self._locks.get(key)
            if lock is None:
                if len(self._locks) >= self._limit:
                    self._locks.clear()
                lock = self._locks[key] = threading.Lock()
        if not lock.acquire(blocking=False):
            if self._before_wait is not None:
                self._before_wait()
            lock.acquire()
        try:
            yield
        finally:
            lock.release()


class Recent:
    """Results kept in this process for `seconds`, at most `size` of them (the oldest go first).
    A key many threads ask for at once is computed by one of them; the others wait for it."""

    def __init__(
        self, seconds: float, size: int = 256, before_wait: Callable[[], None] | None = None
    ) -> None:
        self.seconds, self.size = seconds, size
        self._kept: OrderedDict[Hashable, tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self._computing = KeyedLocks(before_wait=before_wait)

    def get(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        if (hit := self._hit(key)) is not None:
            return hit[1]
        with self._computing(key):
            if (hit := self._hit(key)) is not None:
                return hit[1]
            at = time.monotonic()
            value = compute()
            with self._lock:
                self._kept[key] = (at, value)
                self._kept.move_to_end(key)
                while len(self._kept) > self.size:
                    self._kept.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()

    def _hit(self, key: Hashable) -> tuple[float, Any] | None:
        with self._lock:
            hit = self._kept.get(key)
            if hit is None or time.monotonic() - hit[0] >= self.seconds:
                return None
            self._kept.move_to_end(key)
            return hit
