"""Real workers, one on a host whose container engine runs and one whose engine is hidden
(EVALSITE_CONTAINER_ENGINE=none): each says so on the workers page, and container trials reach
only the first. The container driver is not under test: such a trial may end in an error."""

import os
from pathlib import Path

import pytest
from django.conf import settings
from django.urls import reverse

from conftest import WorkerProcess, purge_broker, wait_for
from runs_app.launching import LaunchOptions, launch_run
from runs_app.models import Trial, Worker
from runs_app.tests.containers import (
    container_suite,
    purge_container_queues,
    require_engine,
)
from runs_app.tests.workers import wait_for_run


@pytest.mark.django_db(transaction=True)
def test_only_a_worker_whose_host_runs_containers_says_so_and_takes_container_trials(
    tmp_path, monkeypatch, member_client
):
    engine = require_engine()
    # As the first trial on a host leaves it (a fresh checkout's test root is made 0700 otherwise).
    Path(settings.SANDBOX_ROOT).mkdir(exist_ok=True)
    os.chmod(settings.SANDBOX_ROOT, 0o711)
    purge_broker()
    purge_container_queues()
    capable = WorkerProcess(tmp_path, extra_env={"EVALSITE_HOST": "host-c"}).start()
    hidden = WorkerProcess(
        tmp_path, extra_env={"EVALSITE_HOST": "host-n", "EVALSITE_CONTAINER_ENGINE": "none"}
    ).start()
    try:
        reports = wait_for(
            lambda: (
                dict(Worker.objects.filter(slots__gt=0).values_list("hostname", "capabilities"))
                if Worker.objects.filter(slots__gt=0).count() == 2
                else None
            ),
            timeout=60,
            message=lambda: f"both workers to report; logs:\n{capable.log()[-3000:]}\n{hidden.log()[-3000:]}",
        )
        assert reports["host-c"]["containers"] and reports["host-c"]["engine"] == engine["engine"]
        assert reports["host-n"] == {
            "containers": False,
            "reason": "EVALSITE_CONTAINER_ENGINE=none: this host takes no container trials",
        }
        page = member_client.get(reverse("worker_list")).content.decode()
        assert f"yes: {engine['engine']}" in page
        assert 'no: <span class="muted">EVALSITE_CONTAINER_ENGINE=none: this host takes no' in page

        experiment = container_suite(tmp_path, boxed=2, plain=2, repeats=2)
        boxed = launch_run(experiment, options=LaunchOptions(task_slugs=["b0", "b1"]))
        plain = launch_run(experiment, options=LaunchOptions(task_slugs=["t0", "t1"]))
        wait_for_run(boxed, timeout=120, worker=hidden)
        wait_for_run(plain, timeout=120, worker=hidden)

        assert set(Trial.objects.filter(run=boxed).values_list("host", flat=True)) == {"host-c"}
        assert set(Trial.objects.filter(run=plain).values_list("status", flat=True)) == {"passed"}
        assert "takes no container trials: EVALSITE_CONTAINER_ENGINE=none" in hidden.log()
    finally:
        purge_container_queues()
