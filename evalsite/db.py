"""The database as the web process meets it under load and in an outage: a pooled connection given
back before a wait, and which errors mean "the database is unreachable" or "every connection is
busy" (a 503 page with Retry-After, never a 500)."""

from django.db import connection

from evalsite.postgresql.pool import DatabaseUnreachable, PoolBusy

__all__ = ["DatabaseUnreachable", "PoolBusy", "give_back_connection", "unavailable"]


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
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DatabaseUnreachable):
            return "unreachable"
        if isinstance(exc, PoolBusy):
            return "busy"
        exc = exc.__cause__ or exc.__context__
    return None
