"""What a worker says of its host's container engine, and the queues that follow (no Django, no
engine: a stand-in client)."""

import os

from evalsite.versioning import container_queue, host_queue, trial_queue, worker_queues
from runs_app.engine import hosts

FAKE_CLIENT = """#!/bin/sh
case "$1" in
version) echo 20.10.24+dfsg1 ;;
image) printf 'evalsite/busybox:latest\\ndebian:bookworm-slim\\n' ;;
esac
"""


def client(tmp_path, text: str) -> str:
    path = tmp_path / "docker"
    path.write_text(text)
    os.chmod(path, 0o755)
    return str(path)


def test_it_reports_the_engine_version_and_which_base_images_are_there(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # as a root worker
    found = hosts.container_engine("docker", client(tmp_path, FAKE_CLIENT))

    assert found == {
        "containers": True,
        "engine": "docker 20.10.24+dfsg1",
        "images": ["evalsite/busybox", "debian:bookworm-slim"],
        "missing": ["python:3.11-slim-bookworm"],
    }


def test_it_says_why_a_host_runs_no_containers(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    refusal = "echo 'Cannot connect to the Docker daemon. Is it running?' >&2"
    silent = client(tmp_path, f"#!/bin/sh\n{refusal}\nexit 1\n")

    assert hosts.container_engine("none", silent) == {
        "containers": False,
        "reason": "EVALSITE_CONTAINER_ENGINE=none: this host takes no container trials",
    }
    assert hosts.container_engine("docker", str(tmp_path / "absent"))["reason"] == (
        f"no {tmp_path / 'absent'}: install Debian's docker.io (make containers)"
    )
    assert hosts.container_engine("docker", silent)["reason"] == (
        "the engine does not answer (Cannot connect to the Docker daemon. Is it running?): "
        "start it (make containers)"
    )
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert hosts.container_engine("docker", client(tmp_path, FAKE_CLIENT))["reason"] == (
        "the worker is not root, and the container driver runs on root workers only"
    )


def test_a_worker_takes_container_trials_only_if_its_engine_answered_when_it_started():
    up = {"containers": True, "engine": "docker 20.10.24", "images": [], "missing": []}
    down = {"containers": False, "reason": "the engine does not answer"}

    assert hosts.capabilities(up, up) == up
    assert hosts.capabilities(up, down) == down  # stopped since: said within a minute
    assert hosts.capabilities(down, down) == down
    late = hosts.capabilities(down, up)  # its queues were chosen without the container ones
    assert not late["containers"] and "restart the worker" in late["reason"]


def test_a_container_worker_also_consumes_the_container_copy_of_each_of_its_queues():
    plain = worker_queues("v1", "host-a")
    assert plain == ["celery", "celery@host-a", trial_queue("v1"), host_queue(trial_queue("v1"), "host-a")]

    boxed = worker_queues("v1", "host-a", containers=True)
    assert boxed[:4] == plain
    assert boxed[4:] == [
        "celery.containers",
        "celery.containers@host-a",
        "trials-v1.containers",
        "trials-v1.containers@host-a",
    ]
    assert container_queue(trial_queue("v1")) == "trials-v1.containers"


def test_a_trial_runs_in_a_container_when_its_sandbox_driver_is_docker():
    assert hosts.runs_in_container({"sandbox": {"driver": "docker", "docker": {"image": "x"}}})
    assert not hosts.runs_in_container({"sandbox": {"driver": "tempdir"}})
    assert not hosts.runs_in_container({})
