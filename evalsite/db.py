"""The database as the web and the workers meet it under load and in an outage: a pooled connection
given back before a wait; which errors mean "the database is unreachable" or "every connection is
busy" (a 503 page with Retry-After, never a 500); and a write a worker repeats until the database
is back (a trial's outcome is reported, not run again)."""

import contextlib
import logging
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError, connection

__all__ = [
    "drop_connection",
    "give_back_connection",
    "persistently",
    "unavailable",
]

logger = logging.getLogger(__name__)
T = TypeVar("T")


def give_back_connection() -> None:
    """Return this thread's pooled connection before it waits on another thread (which may need
    one of the pool's connections). Nothing to do outside a pool, or inside a transaction."""
    if (
        connection.connection is not None
        and "pool" in connection.settings_dict["OPTIONS"]
        and not connection.in_atomic_block
    ):
        connection.close()


def unavailable(exc: BaseException) -> str | None:
    """ "unreachable" when `exc` says the database cannot be reached, "busy" when every pooled
    connection stayed taken for the pool's timeout; None for any other error."""
    # Only a PostgreSQL pool raises these: importing psycopg for them would cost every process
    # on the embedded default ~9 MB, so a process that never made the pool has neither.
    pool = sys.modules.get("evalsite.postgresql.pool")
    if pool is None:
        return None
    seen = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, pool.DatabaseUnreachable):
            return "unreachable"
        if isinstance(cause, pool.PoolBusy):
            return "busy"
        cause = cause.__cause__ or cause.__context__
    return None


def drop_connection() -> None:
    """Forget this thread's connection after an error that may have broken it: the next query
    connects afresh (Django reconnects only a connection it knows to be closed)."""
    with contextlib.suppress(DatabaseError):  # broken already: close() forgets it all the same
        connection.close()


def persistently(action: Callable[[], T], *, seconds: float, what: str) -> T:
    """`action()`, tried again while the database cannot be reached (a restart, a cut network,
    a lock wait that timed out), each time on a fresh connection, for up to `seconds`; then its
    error is raised. `action` must be safe to repeat: one transaction that either committed
    or did nothing."""
    deadline = time.monotonic() + seconds
    delay, tries = 0.5, 0
    while True:
        try:
            result = action()
        except (OperationalError, InterfaceError) as exc:
            if connection.in_atomic_block or time.monotonic() + delay > deadline:
                raise
            tries += 1
            if tries == 1:
                logger.warning(
                    "%s: the database did not answer (%s); trying again for %g s", what, exc, seconds
                )
            drop_connection()
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
            continue
        if tries:
            logger.warning("%s: done after %d tries", what, tries + 1)
        return result
