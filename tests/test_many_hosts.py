"""Two worker hosts that share nothing but PostgreSQL, Redis and object storage run one run
together; one host's link is cut mid-run, its trials go to the other, and every trial ends once.

The hosts are network namespaces on this machine (tests/hosts.py), each with its own veth link,
address, sandbox root and var folder, and a mount namespace where the other host's folder and
the web host's var folder are empty. This is the production stack's behaviour: on the embedded
default (SQLite, filesystem broker), workers share one machine's files by design.
"""

import os
import secrets
import shutil
import subprocess
import time
from collections import Counter

import pytest
from django.conf import settings
from django.core.files.storage import default_storage
from django.db import connection

from conftest import BASE_DIR, WorkerProcess, wait_for, worker_environment
from runs_app.launching import LaunchOptions, launch_run
from runs_app.models import Trial, TrialEvent, Worker
from runs_app.tests.workers import small_suite, wait_for_run
from tests.hosts import NetnsHost, Relay, can_build_hosts

pytestmark = pytest.mark.django_db(transaction=True)

FAST_RECOVERY = {
    "TRIAL_LEASE_SECONDS": "3",
    "REAPER_INTERVAL_SECONDS": "1",
    "REDISPATCH_AFTER_SECONDS": "3",
    # The cut host may be inside a transaction holding the run's row: PostgreSQL ends its session.
    "DATABASE_IDLE_IN_TRANSACTION_SECONDS": "5",
}


@pytest.fixture
def two_hosts(s3_server):
    if connection.vendor != "postgresql" or not settings.CELERY_BROKER_URL.startswith("redis://"):
        pytest.skip(
            "worker hosts share only networked services: the production pass (PostgreSQL + Redis) runs this"
        )
    if why := can_build_hosts():
        pytest.fail(f"cannot build worker hosts on this machine: {why}")
    session = f"{os.getpid() % 100000}{secrets.token_hex(2)}"
    hosts = [NetnsHost("host-a", 1, session), NetnsHost("host-b", 2, session)]
    relay = Relay()
    try:
        for host in hosts:
            host.create()
            for port in (connection.settings_dict["PORT"] or 5432, 6379, s3_server.port):
                relay.forward(host.gateway, int(port), int(port))
            (host.root / "var" / f"marker-{host.name}").write_text(host.name)
        for host in hosts:
            others = [other.root for other in hosts if other is not host]
            host.hidden = [*others, BASE_DIR / "var"]
        yield hosts
    finally:
        relay.stop()
        for host in hosts:
            host.destroy()
        shutil.rmtree(hosts[0].root.parent, ignore_errors=True)


def start_worker(host: NetnsHost, log_dir, s3_server) -> WorkerProcess:
    base = worker_environment()
    services = {
        "DATABASE_URL": base["DATABASE_URL"],
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "EVALSITE_S3_ENDPOINT_URL": s3_server.url,
    }
    env = {**s3_server.env, **FAST_RECOVERY, **host.environment(services)}
    return WorkerProcess(log_dir, extra_env=env, beat=True, prefix=host.wrap()).start()


def test_two_hosts_run_one_run_and_a_cut_host_loses_its_trials_to_the_other(tmp_path, two_hosts, s3_server):
    host_a, host_b = two_hosts
    # Each host sees its own folder and not the other's (nor the web host's var folder).
    for host, other in ((host_a, host_b), (host_b, host_a)):
        listing = f"ls -A {host.root / 'var'}; echo --; ls -A {other.root}; ls -A {BASE_DIR / 'var'}"
        seen = subprocess.run(
            [*host.wrap(), "sh", "-c", listing], capture_output=True, text=True, check=True
        ).stdout
        assert seen.split("--")[0].split() == [f"marker-{host.name}"] and not seen.split("--")[1].split(), (
            seen
        )

    experiment = small_suite(tmp_path, 4, "sleep 3 && echo done > out.txt", parallel=4, repeats=3)
    workers = {host.name: start_worker(host, tmp_path, s3_server) for host in two_hosts}
    run = launch_run(experiment, options=LaunchOptions(keep_artifacts=True))

    def running_on(name):
        return set(Trial.objects.filter(run=run, status="running", host=name).values_list("pk", flat=True))

    def logs():
        errors = Trial.objects.filter(run=run, status="error").values_list("host", "error_message")[:3]
        return "\n".join(
            [
                f"errors: {list(errors)}",
                *(f"--- {name}:\n{worker.log()[-3000:]}" for name, worker in workers.items()),
            ]
        )

    wait_for(
        # Host A has stored a result and runs more: cut it there.
        lambda: (
            running_on("host-a")
            and running_on("host-b")
            and Trial.objects.filter(run=run, host="host-a", status="passed").exists()
        ),
        timeout=120,
        message=lambda: "both hosts to run trials, host A to finish one\n" + logs(),
    )
    cut_off = running_on("host-a")
    host_a.cut()
    run = wait_for_run(run, timeout=180, worker=workers["host-b"])

    trials = list(Trial.objects.filter(run=run))
    assert len(trials) == 12 and {t.status for t in trials} == {"passed"}, logs()
    by_pk = {t.pk: t for t in trials}
    for pk in cut_off:  # re-queued on the other host, the attempt counted
        assert by_pk[pk].host == "host-b" and by_pk[pk].attempt >= 2, (pk, by_pk[pk].host, by_pk[pk].attempt)
    assert {t.host for t in trials} == {"host-a", "host-b"}
    finished = Counter(
        TrialEvent.objects.filter(trial__run=run, kind="phase", data__phase="finished").values_list(
            "trial_id", flat=True
        )
    )
    assert finished == Counter({t.pk: 1 for t in trials})  # every trial ended exactly once
    requeued = TrialEvent.objects.filter(
        trial_id__in=cut_off, kind="system", data__text__icontains="stopped renewing"
    )
    assert requeued.count() >= len(cut_off)

    # The web host reads every kept workspace, whichever host stored it.
    for trial in trials:
        assert trial.artifact and default_storage.open(trial.artifact).read(2) == b"\x1f\x8b"
    # Each host fetched the bundles into its own cache (no shared task files).
    for host in two_hosts:
        assert any((host.root / "var" / "bundles").glob("*.bundle")), host.name

    # The cut host comes back: it holds no trial any more, and writes nothing.
    before = (list(Trial.objects.filter(run=run).order_by("pk").values_list("status", "host", "attempt")),
              TrialEvent.objects.filter(trial__run=run).count())  # fmt: skip
    host_a.restore()
    wait_for(
        lambda: Worker.objects.filter(hostname="host-a", last_seen_at__gt=run.finished_at).exists(),
        timeout=60,
        message=lambda: "the cut host to report again\n" + logs(),
    )
    time.sleep(3 * int(FAST_RECOVERY["TRIAL_LEASE_SECONDS"]))
    after = (list(Trial.objects.filter(run=run).order_by("pk").values_list("status", "host", "attempt")),
             TrialEvent.objects.filter(trial__run=run).count())  # fmt: skip
    assert after == before
