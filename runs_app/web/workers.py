"""Which worker processes are alive, on which hosts, running what: the workers page, and the run
page's banner (a run whose trials wait says whether any worker can take them)."""

from collections import Counter
from datetime import timedelta

from django.contrib.auth.decorators import login_required
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from runs_app import control
from runs_app.models import Run, Trial, Worker

# Workers not heard from for this long are left off the workers page.
FORGOTTEN_AFTER = timedelta(days=1)


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
        "none": not alive and not run.n_running,
        "other_version": bool(alive) and not able and not run.n_running and not no_containers,
        "no_containers": bool(alive) and not able and not run.n_running and no_containers,
        "last_seen": last.last_seen_at if last else None,
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
    return render(request, "runs/workers.html", {"rows": rows, "by_host": list(by_host), "now": now})
