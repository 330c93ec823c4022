"""Files a person asks a command for (a report, an export) belong to that person's world, not to
evalsite's private folders."""

import os
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings


@contextmanager
def user_umask() -> Iterator[None]:
    """Write with the umask the process started with: evalsite's own files (var/: the database,
    the broker, the secret key) are made 0600 by the umask settings.py sets, and a report
    written under it was unreadable to the team it was written for."""
    previous = os.umask(settings.USER_UMASK)
    try:
        yield
    finally:
        os.umask(previous)
