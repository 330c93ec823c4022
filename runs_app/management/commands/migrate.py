"""`manage.py migrate`: Django's, which gives up on a lock it cannot get instead of stalling the
site (PostgreSQL).

A migration that alters a table waits for every transaction using it to end (a worker storing a
trial, a page reading the run), and while it waits every new read of that table queues behind
it: with a run in flight, `migrate` waited 19.7 s on a row lock and the pages with it. With
`lock_timeout` it stops after MIGRATE_LOCK_TIMEOUT_SECONDS instead, that migration rolled back
(PostgreSQL migrations run in a transaction), and says what to do (docs/operations.md).
"""

from django.conf import settings
from django.core.management.base import CommandError
from django.core.management.commands import migrate
from django.db import OperationalError, connections

LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's SQLSTATE for lock_timeout


class Command(migrate.Command):
    def handle(self, *args, **options):
        connection = connections[options["database"]]
        seconds = settings.MIGRATE_LOCK_TIMEOUT_SECONDS
        if connection.vendor == "postgresql" and seconds:
            with connection.cursor() as cursor:
                cursor.execute(f"SET lock_timeout = '{int(seconds * 1000)}ms'")
        try:
            return super().handle(*args, **options)
        except OperationalError as exc:
            if getattr(exc.__cause__, "sqlstate", None) != LOCK_NOT_AVAILABLE:
                raise
            raise CommandError(
                f"migrate stopped: a table it must change stayed locked for {seconds:g} s by another "
                "session (a worker storing a trial, a page reading a run: a run is in flight). The "
                "migration that was applying was rolled back; those before it are applied. Stop the "
                "workers or let the runs end, then run migrate again (docs/operations.md, "
                f"MIGRATE_LOCK_TIMEOUT_SECONDS). PostgreSQL said: {str(exc).strip()}"
            ) from None
