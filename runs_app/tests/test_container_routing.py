"""Runs with container tasks: refused while no live worker runs containers, saying why; otherwise
sent whole to the container copy of their queue, which only such workers consume."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from conftest import purge_broker
from evalsite.versioning import code_version, container_queue, host_queue, trial_queue
from runs_app import control
from runs_app.launching import LaunchError, LaunchOptions, launch_run
from runs_app.models import Run, Worker
from runs_app.tests.containers import (
    container_suite,
    purge_container_queues,
    queue_size,
)
from runs_app.web.workers import worker_health

ENGINE = {"containers": True, "engine": "docker 20.10.24+dfsg1", "images": [], "missing": []}
HIDDEN = {"containers": False, "reason": "EVALSITE_CONTAINER_ENGINE=none: this host takes no containers"}


def reporting(name: str, host: str, capabilities: dict, ago: timedelta = timedelta(0)) -> Worker:
    return Worker.objects.create(
        name=name, hostname=host, code_version=code_version(), capabilities=capabilities,
        last_seen_at=timezone.now() - ago,
    )  # fmt: skip


@pytest.mark.django_db
def test_a_container_run_is_refused_while_no_worker_is_alive(tmp_path):
    experiment = container_suite(tmp_path, boxed=2, plain=1)

    with pytest.raises(LaunchError) as refused:
        launch_run(experiment)

    assert str(refused.value) == (
        "b0, b1 run in a container (sandbox.driver: docker) and no worker is alive: start the "
        "container engine on a worker host (make containers) and restart its worker "
        "(docs/deploy.md, adding a container host), or leave these tasks out of the run"
    )
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_a_container_run_is_refused_naming_why_each_live_host_runs_no_containers(tmp_path):
    experiment = container_suite(tmp_path, boxed=1)
    reporting("w1@host-n", "host-n", HIDDEN)
    reporting("w1@host-old", "host-old", {})  # reported before workers said (an older worker)
    reporting("w1@host-gone", "host-gone", ENGINE, ago=timedelta(minutes=5))  # silent: not alive

    with pytest.raises(LaunchError, match="b0 run in a container") as refused:
        launch_run(experiment)

    message = str(refused.value)
    assert "no live worker runs containers (host-n: EVALSITE_CONTAINER_ENGINE=none: this host" in message
    assert "host-old: it has not said)" in message
    assert "host-gone" not in message and "make containers" in message


@pytest.mark.django_db
def test_a_run_with_container_tasks_goes_whole_to_the_container_queue(tmp_path):
    experiment = container_suite(tmp_path, boxed=1, plain=1)
    capable = reporting("w1@host-c", "host-c", ENGINE)
    plain_worker = reporting("w1@host-n", "host-n", HIDDEN)

    run = launch_run(experiment)
    anyone = launch_run(experiment, options=LaunchOptions(any_code_version=True))
    plain = launch_run(experiment, options=LaunchOptions(task_slugs=["t0"]))

    assert run.config["needs_containers"] and "needs_containers" not in plain.config
    assert control.trial_queue_of(run) == container_queue(trial_queue(code_version()))
    assert control.trial_queue_of(anyone) == "celery.containers"
    assert control.trial_queue_of(plain) == trial_queue(code_version())
    assert control.may_take(run, capable) and not control.may_take(run, plain_worker)
    assert control.may_take(plain, capable) and control.may_take(plain, plain_worker)
    # A suite set up on a host keeps the run on that host's container workers.
    Run.objects.filter(pk=run.pk).update(suite_status=Run.Suite.READY, suite_host="host-c")
    run.refresh_from_db()
    assert control.trial_queue_of(run) == host_queue(container_queue(trial_queue(code_version())), "host-c")
    assert control.may_take(run, capable)


@pytest.mark.django_db
def test_dispatch_reads_whether_a_run_needs_containers_without_loading_its_config(
    tmp_path, django_assert_num_queries
):
    reporting("w1@host-c", "host-c", ENGINE)
    run = launch_run(container_suite(tmp_path, boxed=1))
    deferred = Run.objects.defer(*Run.BULKY_FIELDS).get(pk=run.pk)

    with django_assert_num_queries(1):
        assert control.needs_containers(deferred)
    assert "config" in deferred.get_deferred_fields()


@pytest.mark.django_db(transaction=True)
def test_dispatch_puts_container_trials_on_the_container_queue_only(tmp_path):
    purge_broker()
    purge_container_queues()
    reporting("w1@host-c", "host-c", ENGINE)
    run = launch_run(container_suite(tmp_path, boxed=1, plain=1, repeats=2))
    plain_queue = trial_queue(code_version())
    before = queue_size(plain_queue)
    try:
        control.dispatch(run.pk)  # what a worker's dispatch_run does

        assert queue_size(container_queue(plain_queue)) == 4
        assert queue_size(plain_queue) == before
    finally:
        purge_container_queues()
        purge_broker()


@pytest.mark.django_db
def test_the_run_page_says_no_live_worker_runs_containers_rather_than_another_version(
    tmp_path, member_client
):
    reporting("w1@host-c", "host-c", ENGINE)
    run = launch_run(container_suite(tmp_path, boxed=1))
    Worker.objects.filter(hostname="host-c").update(capabilities=HIDDEN)

    health = worker_health(run, timezone.now())

    assert health["no_containers"] and not health["other_version"] and not health["none"]
    page = member_client.get(reverse("run_detail", args=[run.pk])).content.decode()
    assert "no live worker runs containers: its trials wait for one" in page
    Worker.objects.filter(hostname="host-c").update(capabilities=ENGINE, code_version="0ld")
    health = worker_health(run, timezone.now())
    assert health["other_version"] and not health["no_containers"]
