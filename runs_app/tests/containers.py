"""What the container tests share: suites of container tasks, the broker's container queues, and
the engine they need (skipped without one, except where it must run: EVALSITE_REQUIRE_CONTAINERS)."""

import json
import os
from pathlib import Path

import pytest
from celery import current_app
from django.conf import settings
from kombu.exceptions import ChannelError

from evalsite.versioning import code_version, worker_queues
from runs_app.engine import hosts
from runs_app.tests.factories import import_folder_tasks, make_experiment, make_task
from runs_app.tests.workers import SLOW_AGENT, SMALL_TASK

# A trivial container task: the routing is under test, not the container driver.
BOXED_TASK = """
task_id: {slug}
initial_prompt: "Write out.txt"
sandbox: {{driver: docker, docker: {{image: evalsite/busybox}}}}
success_criteria:
  - type: file_exists
    path: out.txt
"""


def container_suite(folder: Path, boxed: int, plain: int = 0, repeats: int = 1):
    """An experiment over `boxed` container tasks (b0, b1...) and `plain` namespace-sandbox ones."""
    for i in range(boxed):
        make_task(folder, f"b{i}", BOXED_TASK.format(slug=f"b{i}"))
    for i in range(plain):
        make_task(folder, f"t{i}", SMALL_TASK.format(slug=f"t{i}"))
    import_folder_tasks(folder)
    command = json.dumps("echo done > out.txt")
    return make_experiment(folder, SLOW_AGENT.format(parallel=4, repeats=repeats, command=command))


def container_queues() -> list[str]:
    """This code version's container queues (shared and own), for this host and any."""
    plain = worker_queues(code_version(), settings.WORKER_HOST)
    return [name for name in worker_queues(code_version(), settings.WORKER_HOST, True) if name not in plain]


def queue_size(name: str) -> int:
    with current_app.connection_for_read() as connection:
        try:
            return connection.default_channel.queue_declare(queue=name, passive=True).message_count
        except ChannelError:  # never declared (Redis): nothing was sent there
            return 0


def purge_container_queues() -> None:
    """`purge_broker` empties this process's own queues only: a container trial's message left
    behind would reach the next test's container worker (trial ids repeat across tests)."""
    with current_app.connection_for_write() as connection:
        for name in container_queues():
            connection.default_channel.queue_purge(name)


def require_engine() -> dict:
    """This host's engine, or the test skipped (failed where it must run: .ci/run as root)."""
    found = hosts.container_engine("docker", settings.DOCKER_CLI)
    if not found["containers"]:
        why = f"no container engine here: {found['reason']}"
        if os.environ.get("EVALSITE_REQUIRE_CONTAINERS"):
            pytest.fail(f"{why} (EVALSITE_REQUIRE_CONTAINERS is set: the engine must run here)")
        pytest.skip(why)
    return found


def container_worker(log_dir: Path, concurrency: int = 2, extra_env: dict[str, str] | None = None):
    """A real worker that takes container trials, once it has said so (launches need that)."""
    from conftest import WorkerProcess, purge_broker, wait_for
    from runs_app import control

    purge_broker()
    purge_container_queues()
    # As the first trial on a host leaves it (a fresh checkout's test root is made 0700 otherwise).
    Path(settings.SANDBOX_ROOT).mkdir(exist_ok=True)
    os.chmod(settings.SANDBOX_ROOT, 0o711)
    worker = WorkerProcess(log_dir, concurrency=concurrency, extra_env=extra_env).start()
    wait_for(
        lambda: control.container_workers().exists(),
        timeout=60,
        message=lambda: f"the worker to report it runs containers; log:\n{worker.log()[-3000:]}",
    )
    return worker
