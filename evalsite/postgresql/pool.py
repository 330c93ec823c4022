"""psycopg's connection pool, made to say at once when the database is unreachable and to find it
again within a second of its return.

psycopg's own pool, in an outage, makes every request wait its whole `timeout` (10 s) for a
connection that cannot come, and retries with a back-off that doubles up to minutes: after a
144 s outage, pages kept failing for 86 s more. This one:

1. remembers whether its latest attempt to connect failed (and why), and tells the requests
   waiting for a connection at once;
2. while it has, refuses a request at once (`DatabaseUnreachable`), except one probe every
   RECONNECT_SECONDS, which asks for a connection as usual (and so starts a new attempt when
   psycopg has given up);
3. tries to reconnect every RECONNECT_SECONDS, steadily, for as long as psycopg's
   `reconnect_timeout` allows (then the next probe starts again);
4. says `PoolBusy` when the database answers but every connection stayed taken for the timeout.
"""

import logging
import threading
import time

from psycopg_pool import ConnectionPool, PoolTimeout
from psycopg_pool.base import AttemptWithBackoff

logger = logging.getLogger(__name__)

RECONNECT_SECONDS = 1.0
# How long the probe request waits for the pool's new connection.
PROBE_SECONDS = 2.0


class DatabaseUnreachable(PoolTimeout):
    """The pool's latest attempt to connect failed: the database is down or unreachable."""


class PoolBusy(PoolTimeout):
    """The database answers, but every pooled connection stayed taken for the pool's timeout."""


class SteadyAttempt(AttemptWithBackoff):
    """Reconnection attempts every RECONNECT_SECONDS (psycopg's double each time)."""

    def update_delay(self, now: float) -> None:
        if self.delay == 0.0:
            self.give_up_at = now + self.timeout
        self.delay = min(RECONNECT_SECONDS, max(0.0, self.give_up_at - now))


class Pool(ConnectionPool):
    def __init__(self, *args, **kwargs) -> None:
        self.down_since: float | None = None  # monotonic; None while the database answers
        self.down_reason = ""
        self._next_probe = 0.0
        self._health = threading.Lock()
        super().__init__(*args, **kwargs)

    def unreachable(self) -> DatabaseUnreachable:
        return DatabaseUnreachable(f"the database is unreachable: {self.down_reason}")

    def getconn(self, timeout: float | None = None):
        timeout = self.timeout if timeout is None else timeout
        if self.down_since is not None:
            with self._health:
                probe = time.monotonic() >= self._next_probe
                if probe:
                    self._next_probe = time.monotonic() + RECONNECT_SECONDS
            if not probe:
                raise self.unreachable()
            timeout = min(timeout, PROBE_SECONDS)
        try:
            return super().getconn(timeout)
        except PoolTimeout:
            if self.down_since is not None:
                raise self.unreachable() from None
            raise PoolBusy(f"all {self.max_size} pooled connections stayed busy for {timeout:g} s") from None

    def _connect(self, timeout: float | None = None):
        try:
            conn = super()._connect(timeout)
        except Exception as exc:
            self._went_down(exc)
            raise
        with self._health:
            if self.down_since is not None:
                logger.warning("database reachable again after %.1f s", time.monotonic() - self.down_since)
                self.down_since = None
        return conn

    def _went_down(self, exc: Exception) -> None:
        with self._health:
            if self.down_since is None:
                self.down_since = time.monotonic()
                logger.warning("database unreachable: %s", exc)
            self.down_reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        # Whoever waits for a connection is told now, not at the end of their timeout.
        with self._lock:
            waiting = list(self._waiting)
            self._waiting.clear()
        for client in waiting:
            client.fail(self.unreachable())

    def _add_connection(self, attempt: AttemptWithBackoff | None, growing: bool = False) -> None:
        super()._add_connection(attempt or SteadyAttempt(timeout=self.reconnect_timeout), growing)
