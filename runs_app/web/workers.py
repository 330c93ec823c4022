"""Which worker processes are alive, on which hosts, running what: the workers page, and the run
page's banner (a run whose trials wait says whether any worker can take them, whether the broker
answers, and which of its trials lost their worker)."""

import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

from celery import current_app
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from evalsite.agents_install import install_status
from evalsite.db import give_back_connection
from evalsite.keyed_locks import Recent
from runs_app import control
from runs_app.models import Run, Trial, Worker

# Workers not heard from for this long are left off the workers page.
FORGOTTEN_AFTER = timedelta(days=1)
# The broker is asked at most this often per web process whether it answers.
_broker = Recent(5.0, size=1, before_wait=give_back_connection)


def broker_problem() -> str | None:
    """Why the workers' broker cannot be reached now ("" never), or None when it answers. While
    it cannot, no trial is sent and no worker hears of a cancel: queued trials wait, running
    ones finish and report (their results go to the database), and the reaper sends what
    waits once it is back."""
    return _broker.get("broker", _ask_broker)


def forget() -> None:
    _broker.clear()


def _ask_broker() -> str | None:
    connection = current_app.connection_for_write(connect_timeout=1)
    try:
        connection.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=2)
        return None
    except Exception as exc:  # whatever the transport raises, the page says it
        return f"{connection.as_uri()}: {exc}"
    finally:
        connection.release()


def running_by_worker() -> Counter:
    """Running trials per worker process name (a lease owner is `name:pid`)."""
    owners = Trial.objects.filter(status=Trial.Status.RUNNING).values_list("lease_owner", flat=True)
    return Counter(owner.rsplit(":", 1)[0] for owner in owners)


def worker_health(run: Run, now) -> dict | None:
    """For a run with trials waiting: the workers seen lately, what each runs, this run's trials
    per host, and whether any alive worker may take them (None once nothing waits)."""
    if run.is_final or not (run.n_queued or run.n_running):
        return None
    alive = list(control.live_workers(now).order_by("name"))
    # Running trials whose worker stopped renewing their lease (killed, or cut off): they count
    # as running until the reaper takes them back (control.holder_gone).
    stranded = (
        Trial.objects.for_run(run).filter(status=Trial.Status.RUNNING, lease_expires_at__lt=now).count()
    )
    running = running_by_worker()
    hosts = (
        Trial.objects.for_run(run)
        .filter(status=Trial.Status.RUNNING)
        .values_list("host")
        .annotate(n=Count("pk"))
        .order_by("host")
    )
    able = [worker for worker in alive if control.may_take(run, worker)]
    # A container run that no live worker can take waits for one that runs containers, whatever
    # their code versions.
    no_containers = control.needs_containers(run) and not any(
        (worker.capabilities or {}).get("containers") for worker in alive
    )
    last = Worker.objects.order_by("-last_seen_at").first()
    return {
        "alive": [(worker, running.get(worker.name, 0)) for worker in alive],
        "hosts": list(hosts),
        "none": not alive,
        "other_version": bool(alive) and not able and not run.n_running and not no_containers,
        "no_containers": bool(alive) and not able and not run.n_running and no_containers,
        "last_seen": last.last_seen_at if last else None,
        "stranded": stranded,
        "broker": broker_problem(),
    }


@login_required
@require_GET
def worker_list(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    recent = Worker.objects.filter(last_seen_at__gte=now - FORGOTTEN_AFTER)
    workers = list(recent.order_by("hostname", "name"))
    running = running_by_worker()
    since = control.alive_since(now)
    rows = [
        {
            "worker": worker,
            "alive": worker.last_seen_at >= since,
            "running": running.get(worker.name, 0),
        }
        for worker in workers
    ]
    by_host = (
        Trial.objects.filter(status=Trial.Status.RUNNING)
        .values_list("host", "run_id")
        .annotate(n=Count("pk"))
        .order_by("host", "run_id")
    )
    stranded = (
        Trial.objects.filter(status=Trial.Status.RUNNING, lease_expires_at__lt=now)
        .values_list("lease_owner", "run_id")
        .annotate(n=Count("pk"))
        .order_by("lease_owner", "run_id")
    )
    context = {
        "rows": rows, "by_host": list(by_host), "now": now, "broker": broker_problem(),
        "stranded": [(owner.rsplit(":", 1)[0], run_id, n) for owner, run_id, n in stranded],
        "agents_install": agents_install(),
    }  # fmt: skip
    return render(request, "runs/workers.html", context)


def agents_install() -> dict | None:
    """How far `make run`'s background install of the agent CLIs got on this host (None: none
    started, or done more than a day ago), with the end of its log when it failed."""
    status = install_status(Path(settings.VAR_DIR))
    if status is None or (status["state"] == "done" and time.time() - status.get("updated", 0) > 86400):
        return None
    if status["state"] == "failed":
        try:
            # (scripts/install_agents.sh writes var/log/agents.log: the VAR_DIR of `make run`)
            lines = (Path(settings.VAR_DIR) / "log" / "agents.log").read_text(errors="replace").splitlines()
        except OSError:
            lines = []
        status["log_tail"] = "\n".join(lines[-12:])
    return status
