"""Worker hosts: which host ran a trial, what a worker reports of itself, code versions that keep a
run on workers of its own code, bundles fetched once per host, and a host that lost its lease
writing nothing more to the trial."""

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from django.utils import timezone

from conftest import WorkerProcess, wait_for
from evalsite.versioning import code_version, trial_queue
from experiments_app.models import Bundle
from experiments_app.specs.bundles import make_bundle
from runs_app import control
from runs_app.engine import bundle_cache, leases, recording, runner
from runs_app.launching import LaunchOptions, launch_run
from runs_app.models import Trial, TrialEvent, Worker
from runs_app.tests.workers import small_suite, wait_for_run


@pytest.mark.django_db(transaction=True)
def test_a_worker_of_another_code_version_leaves_a_run_to_workers_of_its_own(tmp_path):
    experiment = small_suite(tmp_path, 2, "echo done > out.txt", parallel=4, repeats=2)
    pinned = launch_run(experiment)
    open_to_any = launch_run(experiment, options=LaunchOptions(any_code_version=True))
    assert pinned.code_version == code_version()
    assert control.trial_queue_of(pinned) == trial_queue(code_version())
    assert control.trial_queue_of(open_to_any) == "celery"

    upgraded = {"EVALSITE_CODE_VERSION": "next-release", "EVALSITE_HOST": "host-new"}
    newer = WorkerProcess(tmp_path, extra_env=upgraded).start()
    wait_for_run(open_to_any, timeout=90, worker=newer)
    # The pinned run was dispatched first, yet none of its trials reached the newer worker.
    assert set(Trial.objects.filter(run=pinned).values_list("status", "host")) == {("queued", "")}

    same = WorkerProcess(tmp_path, extra_env={"EVALSITE_HOST": "host-old"}).start()
    wait_for_run(pinned, timeout=90, worker=same)
    assert set(Trial.objects.filter(run=pinned).values_list("status", "host")) == {("passed", "host-old")}
    outcomes = set(Trial.objects.filter(run=open_to_any).values_list("status", "host"))
    assert outcomes == {("passed", "host-new")}

    reported = wait_for(
        lambda: (
            dict(Worker.objects.filter(slots__gt=0).values_list("hostname", "code_version"))
            if Worker.objects.filter(slots__gt=0).count() == 2
            else None
        ),
        timeout=60,
        message=lambda: f"both workers to report; log:\n{same.log()[-3000:]}",
    )
    assert reported == {"host-new": "next-release", "host-old": code_version()}
    old = Worker.objects.get(hostname="host-old")
    assert old.slots == 2 and old.started_at is not None
    assert set(old.agent_versions) <= {"claude-code", "codex", "gemini-cli", "opencode", "aider"}


@pytest.mark.django_db
def test_a_claim_refuses_a_trial_of_another_code_version_unless_its_run_accepts_any(tmp_path):
    experiment = small_suite(tmp_path, 1, "true")
    run = launch_run(experiment)
    trial = run.trials.get()
    type(run).objects.filter(pk=run.pk).update(code_version="older")
    assert not runner.claim(trial.pk, "w@h:1")
    type(run).objects.filter(pk=run.pk).update(any_code_version=True)
    assert runner.claim(trial.pk, "w@h:1")
    trial.refresh_from_db()
    assert trial.status == "running" and trial.host  # the claiming host is recorded


@pytest.mark.django_db
def test_a_claim_takes_only_a_queued_trial_of_a_live_run_whose_suite_is_up_here(tmp_path, settings):
    settings.WORKER_HOST = "host-a"
    experiment = small_suite(tmp_path, 1, "true", repeats=2)
    run = launch_run(experiment)
    first, second = run.trials.order_by("pk")
    runs = type(run).objects.filter(pk=run.pk)

    runs.update(cancel_requested=True)
    assert not runner.claim(first.pk, "w@a:1")
    runs.update(cancel_requested=False, suite_status="pending")
    assert not runner.claim(first.pk, "w@a:1")
    runs.update(suite_status="ready", suite_host="host-b")
    assert not runner.claim(first.pk, "w@a:1")
    runs.update(suite_host="host-a")
    before = timezone.now()
    assert runner.claim(first.pk, "w@a:1")
    assert not runner.claim(first.pk, "w@a:2")  # taken: another claim finds no queued row

    first.refresh_from_db()
    assert (first.status, first.lease_owner, first.host) == ("running", "w@a:1", "host-a")
    assert before <= first.started_at <= timezone.now() < first.lease_expires_at
    run.refresh_from_db()
    assert (run.n_running, run.n_queued) == (1, 1)
    runs.update(n_queued=0)  # a count that drifted low stays at zero
    assert runner.claim(second.pk, "w@a:1")
    run.refresh_from_db()
    assert (run.n_running, run.n_queued) == (2, 0)


@pytest.mark.django_db
def test_a_host_fetches_a_bundle_from_the_database_once(tmp_path, settings, django_assert_num_queries):
    settings.BUNDLE_CACHE_DIR = tmp_path / "bundles"
    blob = b"not really a bundle, but immutable bytes"
    Bundle.objects.create(digest="d" * 64, data=blob, size=len(blob))
    bundle_cache.forget()
    with django_assert_num_queries(1):
        assert bundle_cache.bundle_blob("d" * 64) == blob
    bundle_cache.forget()  # another worker process on the same host
    with django_assert_num_queries(0):
        assert bundle_cache.bundle_blob("d" * 64) == blob
    assert [p.name for p in (tmp_path / "bundles").iterdir()] == ["d" * 64 + ".bundle"]


@pytest.mark.django_db
def test_a_host_unpacks_a_bundle_once_readable_by_a_sandbox_uid_only_through_its_path(
    tmp_path, settings, django_assert_num_queries
):
    settings.BUNDLE_CACHE_DIR = tmp_path / "blobs"
    # The session's sandbox root (searchable by others, as a worker's is), a folder of its own.
    Path(settings.SANDBOX_ROOT).mkdir(exist_ok=True)
    os.chmod(settings.SANDBOX_ROOT, 0o711)  # as the first trial on a host leaves it
    settings.SANDBOX_ROOT = Path(settings.SANDBOX_ROOT) / f"unpacking-{os.getpid()}"
    shutil.rmtree(settings.SANDBOX_ROOT, ignore_errors=True)
    files = {"task.yaml": b"task_id: t\n", "grade.sh": b"#!/bin/sh\nexit 0\n", "ref/answer.txt": b"42"}
    packed = make_bundle(files)
    Bundle.objects.create(digest=packed.digest, data=packed.blob, size=packed.size)
    bundle_cache.forget()
    os.umask(old_umask := os.umask(0o077))  # a worker's umask must not make it unreadable
    try:
        folder = bundle_cache.unpacked(packed.digest)
    finally:
        os.umask(old_umask)
    with django_assert_num_queries(0):
        assert bundle_cache.unpacked(packed.digest) == folder  # the next trial: no unpacking

    assert folder == settings.SANDBOX_ROOT / "bundles" / packed.digest
    assert {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()} == files
    assert stat.S_IMODE(folder.parent.stat().st_mode) == 0o711  # lists nothing
    assert stat.S_IMODE((folder / "grade.sh").stat().st_mode) == 0o755
    assert [p.name for p in folder.parent.iterdir()] == [packed.digest]  # no scratch left
    if os.geteuid() == 0:  # the sandbox uid reads it by its path, and cannot write it
        probe = subprocess.run(
            ["setpriv", "--reuid=64999", "--regid=64999", "--clear-groups", "sh", "-c",
             f"cat {folder}/ref/answer.txt; ls {folder.parent}; touch {folder}/x"],
            capture_output=True, text=True,
        )  # fmt: skip
        assert probe.stdout == "42", probe.stderr
        assert "ls: cannot open directory" in probe.stderr  # the folder above lists nothing
        assert "touch: cannot touch" in probe.stderr and not (folder / "x").exists()


@pytest.mark.django_db
def test_a_worker_that_lost_its_lease_writes_no_more_events(tmp_path):
    experiment = small_suite(tmp_path, 1, "true")
    trial = launch_run(experiment).trials.get()
    assert runner.claim(trial.pk, "host-a@a:1")
    trial.refresh_from_db()
    lease = leases.Heartbeat(trial, "host-a@a:1")
    recorder = recording.Recorder(trial.pk, [], first_attempt=True, run_id=trial.run_id, lease=lease)
    recorder.phase("agent", flush=True)
    assert TrialEvent.objects.filter(trial=trial).count() == 1 and not lease.lease_lost.is_set()

    # Cut off, its lease expired and the trial went to another host, which started writing.
    Trial.objects.filter(pk=trial.pk).update(lease_owner="host-b@b:2", lease_expires_at=timezone.now())
    TrialEvent.objects.create(trial=trial, seq=2, at=timezone.now(), kind="phase", data={"phase": "setup"})
    recorder.phase("grading", flush=True)
    assert list(TrialEvent.objects.filter(trial=trial).values_list("seq", "data__phase")) == [
        (1, "agent"),
        (2, "setup"),
    ]
    assert lease.lease_lost.is_set()
