"""Celery entry points: thin, verb-named, ids in, plain-Python runner code underneath."""

import socket

from celery import shared_task
from django.utils import timezone

from runs_app.models import Worker


@shared_task
def record_heartbeat(name: str) -> None:
    """Mark a worker as alive; also the smallest task that proves the queue works end to end."""
    Worker.objects.update_or_create(
        name=name, defaults={"hostname": socket.gethostname(), "last_seen_at": timezone.now()}
    )
