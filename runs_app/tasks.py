"""Celery entry points: thin, verb-named, ids in, plain-Python control code underneath.

control.py sends `dispatch_run` and `execute_trial` by these names (`runs_app.tasks.<name>`).
"""

import logging
import os
import socket
import threading
import time
from pathlib import Path

from celery import shared_task
from celery.signals import celeryd_after_setup, worker_ready
from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from evalsite.db import drop_connection
from evalsite.versioning import code_version, worker_queues
from experiments_app.specs import providers
from runs_app import alerts, control, scheduling
from runs_app.engine import hosts, trial_sandbox
from runs_app.models import Worker

logger = logging.getLogger(__name__)


@shared_task
def dispatch_run(run_id: int) -> None:
    control.dispatch(run_id)


@shared_task(bind=True)
def execute_trial(self, trial_id: int) -> None:
    control.execute(trial_id, worker=f"{self.request.hostname or socket.gethostname()}:{os.getpid()}")


@shared_task(bind=True)
def hold_suite(self, run_id: int) -> None:
    control.hold_suite(run_id, worker=f"{self.request.hostname or socket.gethostname()}:{os.getpid()}")


@shared_task
def reap_expired_leases() -> None:
    control.reap_expired_leases()


@shared_task
def launch_scheduled_runs() -> None:
    scheduling.launch_due()


@shared_task
def alert_run(run_id: int) -> None:
    alerts.alert_run(run_id)


@shared_task
def record_heartbeat(name: str) -> None:
    """Mark a worker as alive; also the smallest task that proves the queue works end to end.
    Any worker may run it, so it says nothing of the host: the worker's own beat does."""
    Worker.objects.update_or_create(name=name, defaults={"last_seen_at": timezone.now()})


# The host's container engine as this worker found it when it started (it then chose its queues).
_engine_at_start: dict = {"containers": False, "reason": "the worker has not looked for an engine yet"}


@celeryd_after_setup.connect
def _take_container_trials(sender, instance, **kwargs) -> None:
    """A worker whose host's engine answers when it starts also consumes the container copies of
    its queues, where the trials of runs with container tasks go (`control.trial_queue_of`). Its
    queues are fixed from then on: an engine started later needs the worker restarted."""
    global _engine_at_start
    _engine_at_start = hosts.container_engine(settings.CONTAINER_ENGINE, settings.DOCKER_CLI)
    if _engine_at_start["containers"]:
        for name in worker_queues(code_version(), settings.WORKER_HOST, containers=True):
            instance.app.amqp.queues.select_add(name)
    else:
        logger.info("this worker takes no container trials: %s", _engine_at_start["reason"])


@worker_ready.connect
def _reap_at_start(sender, **kwargs) -> None:
    """A worker that starts after a crash recovers the dead worker's trials without waiting for
    beat, and removes the sandbox folders they left on this host. Then it reports itself (host,
    slots, code and agent versions, the providers it has keys for, whether it runs containers)
    every WORKER_HEARTBEAT_SECONDS, from its main process (the workers page, the run page's worker
    banner, launch pre-flight, launches of container tasks)."""
    trial_sandbox.sweep_sandboxes()
    reap_expired_leases.delay()
    # Again once this worker has reported twice: a lease counts as lost only once some worker
    # reached the database for a while after it ran out (control.holder_gone), and a deployment
    # without beat has no other reaper.
    reap_expired_leases.apply_async(countdown=2 * settings.WORKER_HEARTBEAT_SECONDS + 1)
    record_heartbeat.delay(sender.hostname)
    slots = settings.WORKER_SLOTS or getattr(getattr(sender, "controller", None), "concurrency", 0) or 0
    threading.Thread(
        target=_beat, args=(sender.hostname, slots), name="worker-heartbeat", daemon=True
    ).start()


SWEEP_EVERY_BEATS = 6


def _beat(name: str, slots: int) -> None:
    started = timezone.now()
    versions = hosts.agent_versions(Path(settings.VAR_DIR) / "agent-versions.json")
    found = _engine_at_start
    keyed = providers.keyed(os.environ)  # names only: the keys stay in this process
    beats = 0
    reachable_since = None  # the first report since the last that failed
    while True:
        beats += 1
        if beats % SWEEP_EVERY_BEATS == 0:
            # An engine that stopped (or whose images went) is said within a minute.
            found = hosts.container_engine(settings.CONTAINER_ENGINE, settings.DOCKER_CLI)
            # A worker killed on this host left its trials' folders (each a file system of its
            # own on a root worker): removed once their leases expired, not at the next start.
            try:
                trial_sandbox.sweep_sandboxes()
            except Exception:
                logger.warning("sweeping sandbox folders failed", exc_info=True)
            # CLIs installed since (`make run` installs them in the background): a cached answer
            # per binary, so this costs a few stat calls when nothing changed.
            versions = hosts.agent_versions(Path(settings.VAR_DIR) / "agent-versions.json")
        try:
            now = timezone.now()
            Worker.objects.update_or_create(
                name=name,
                defaults={
                    "hostname": settings.WORKER_HOST, "slots": slots, "code_version": code_version(),
                    "agent_versions": versions, "providers": keyed, "started_at": started,
                    "last_seen_at": now, "reachable_since": reachable_since or now,
                    "capabilities": hosts.capabilities(_engine_at_start, found),
                },
            )  # fmt: skip
            reachable_since = reachable_since or now
        except Exception as exc:  # a database outage: report on the next beat
            if reachable_since is not None or beats == 1:
                logger.warning("worker heartbeat failed: %s", exc)
            reachable_since = None
            drop_connection()
        finally:
            close_old_connections()
        time.sleep(settings.WORKER_HEARTBEAT_SECONDS)
