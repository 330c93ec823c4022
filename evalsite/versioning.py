"""Which code a process runs, so a run's trials stay on workers that run the same code.

Pure Python (no Django): `evalsite.celery` names its worker's queue with it before settings load.
"""

import hashlib
import os
import re
from functools import cache
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
# What decides how a trial runs and is graded. Tests, docs and benches change no trial.
_SOURCES = ("evalsite", "experiments_app", "runs_app", "templates")


@cache
def code_version() -> str:
    """`EVALSITE_CODE_VERSION` when the deployment names its release, else a digest of the
    project's code: two hosts installed from the same commit agree without being told."""
    given = os.environ.get("EVALSITE_CODE_VERSION", "").strip()
    if given:
        return given[:64]
    digest = hashlib.sha256()
    for top in _SOURCES:
        for path in sorted((BASE_DIR / top).rglob("*")):
            if path.suffix not in (".py", ".html") or "tests" in path.relative_to(BASE_DIR).parts:
                continue
            digest.update(str(path.relative_to(BASE_DIR)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


# The queue every worker takes: dispatch, heartbeats, trials of runs that accept any code version.
SHARED_QUEUE = "celery"


def trial_queue(version: str) -> str:
    """The broker queue of the trials of runs recorded with this code version."""
    return f"trials-{version}"


def host_queue(queue: str, host: str) -> str:
    """`queue` for the workers of one host only (a run whose suite hooks set up on that host)."""
    return f"{queue}@{re.sub(r'[^A-Za-z0-9._-]', '_', host)}"


def container_queue(queue: str) -> str:
    """`queue` for the workers whose host runs containers (the trials of runs with container tasks)."""
    return f"{queue}.containers"


def worker_queues(version: str, host: str, containers: bool = False) -> list[str]:
    """The queues a worker of this code version on this host consumes: the shared queue and its
    version's, each also for its host only (a run whose suite is set up there); with
    `containers` (its host's engine answered when it started) their container copies too."""
    queues = [SHARED_QUEUE, trial_queue(version)]
    if containers:
        queues += [container_queue(queue) for queue in queues]
    return [name for queue in queues for name in (queue, host_queue(queue, host))]
