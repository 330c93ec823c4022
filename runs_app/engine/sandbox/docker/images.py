"""A container task's image on this host: built from the task's Dockerfile and build context
once per host (cached by the context's digest, `specs.docker.image_key`), or named and already
held; with a registry, built once and pushed, pulled by the other hosts.

Builds are serialised per image key with a lock file, so two workers of a host starting the
first trials of a task build once; the second trial finds the image and builds nothing. The
build's output goes to `log` line by line (the trial's transcript shows it). Nothing is pulled
from a public registry: the worker builds offline from base images it holds (`make containers`
makes the project's; an operator loads others with `docker load` or a registry).

Pure Python, no Django.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from experiments_app.specs.docker import image_key
from runs_app.engine.sandbox.base import SandboxError
from runs_app.engine.sandbox.docker import ImageConfig, command, image_config

TASK_REPOSITORY = "evalsite/task"  # built images: evalsite/task:<image key>
DEFAULT_BUILD_TIMEOUT = 600
MAX_CONTEXT_BYTES = 512 << 20  # what a build context may hold (it travels in the task's bundle)
LOG_LINE_CAP = 2000


class ImageError(SandboxError):
    """The task's image could not be had on this host: the message says why and what to do; `log`
    is the build's output, when a build ran."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log


@dataclass(frozen=True)
class TaskImage:
    """The image a trial runs: the reference the engine starts (`evalsite/task:<key>` or the
    task's name), its content digest (the engine's image id, `sha256:...`: provenance, and
    the environment's part of a trial's fingerprint) and whether this call built it."""

    reference: str
    digest: str
    built: bool = False
    pulled: bool = False
    config: ImageConfig | None = None  # what the image says of itself (its USER, WORKDIR, ENV)


def held(reference: str) -> ImageConfig | None:
    """A local image's configuration and id (one call to the engine), or None when this host
    does not hold it."""
    try:
        return image_config(reference)
    except SandboxError as exc:
        if "no such image" in str(exc).lower():
            return None
        raise


def image_id(reference: str) -> str | None:
    """The engine's id of a local image (`sha256:...`), or None when this host does not hold it."""
    found = held(reference)
    return found.id if found is not None else None


def named_image(reference: str) -> TaskImage:
    """A task's `sandbox.docker.image`: it must be on this host already (nothing is pulled)."""
    found = held(reference)
    if found is None:
        raise ImageError(
            f"image {reference!r} is not on this worker and evalsite pulls nothing from a public "
            "registry: load it on every container host (`docker load -i image.tar`, or `docker pull` "
            "where a registry is reachable), or give the task a Dockerfile (sandbox.docker.dockerfile_path)"
        )
    return TaskImage(reference, found.id, config=found)


def built_image(
    key: str,
    context: Path,
    dockerfile: str,
    build: Mapping,
    *,
    lock_dir: Path,
    log: Callable[[str], None],
    timeout: float = DEFAULT_BUILD_TIMEOUT,
    registry: str = "",
    secrets_env: Mapping[str, str] | None = None,
    should_stop: Callable[[], str | None] | None = None,
    network: str = "none",
) -> TaskImage:
    """The image of a Dockerfile task, `evalsite/task:<key>`: held already, pulled from
    `registry` (EVALSITE_IMAGE_REGISTRY) if another host pushed it, else built from `context`
    (and pushed there). `dockerfile` is relative to `context`; `build` is the task's
    `sandbox.docker.build`; `secrets_env` the worker's variables its secrets may read."""
    reference = f"{TASK_REPOSITORY}:{key}"
    with _key_lock(lock_dir, key):
        found = held(reference)
        if found is not None:
            return TaskImage(reference, found.id, config=found)
        if registry and _pulled(f"{registry}/{reference}", reference, log):
            found = held(reference)
            if found is not None:
                return TaskImage(reference, found.id, pulled=True, config=found)
        args, env = build_args(reference, context, dockerfile, build, secrets_env or {}, network)
        _build(reference, context, dockerfile, args, env, log, timeout, should_stop)
        found = held(reference)
        if found is None:
            raise ImageError(f"the build said it made {reference}, and the engine does not hold it")
        if registry:
            _push(f"{registry}/{reference}", reference, log)
        return TaskImage(reference, found.id, built=True, config=found)


_THREAD_LOCKS: dict[str, threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


@contextlib.contextmanager
def _key_lock(lock_dir: Path, key: str) -> Iterator[None]:
    """One builder of an image key per host: a thread lock within the worker, a lock file between
    worker processes."""
    with _THREAD_LOCKS_GUARD:
        thread_lock = _THREAD_LOCKS.setdefault(key, threading.Lock())
    with thread_lock:
        lock_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_dir / f"{key}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def build_args(
    reference: str,
    context: Path,
    dockerfile: str,
    build: Mapping,
    secrets_env: Mapping[str, str],
    network: str = "none",
) -> tuple[list[str], dict[str, str]]:
    """The `docker build` command line of a task and the client's environment (BuildKit on when
    the task asks for it or has secrets; a secret's variable passed only when the worker has it).
    `network`: what RUN steps reach (EVALSITE_BUILD_NETWORK): none by default, since the
    engine's bridge reaches the host's own services."""
    args = ["build", "--tag", reference, "--file", str(context / dockerfile), "--pull=false"]
    args += ["--network", network, "--label", f"{command.LABEL}.image=1"]
    for name, value in (build.get("args") or {}).items():
        args += ["--build-arg", f"{name}={value}"]
    args += list(build.get("extra_args") or [])
    env = command.client_env()
    secrets = list(build.get("secrets") or [])
    buildkit = build.get("buildkit")
    env["DOCKER_BUILDKIT"] = "1" if buildkit or (buildkit is None and secrets) else "0"
    for spec in secrets:
        fields = dict(part.split("=", 1) for part in spec.split(","))
        variable = fields["env"]
        if variable not in secrets_env:
            raise ImageError(
                f"build secret {fields['id']!r} reads the worker's variable {variable}, which this "
                "worker does not hand to builds: set it and list it in EVALSITE_BUILD_SECRETS"
            )
        env[variable] = secrets_env[variable]
        args += ["--secret", f"id={fields['id']},env={variable}"]
    if env["DOCKER_BUILDKIT"] == "1":
        args += ["--progress", "plain"]
    return [*args, str(context)], env


def _build(
    reference: str,
    context: Path,
    dockerfile: str,
    args: list[str],
    env: dict[str, str],
    log: Callable[[str], None],
    timeout: float,
    should_stop: Callable[[], str | None] | None,
) -> None:
    log(f"$ docker build --tag {reference} {context.name}/{dockerfile}")
    started = time.monotonic()
    process = subprocess.Popen(
        [command.docker_binary(), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, env=env, cwd=str(context),
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=_read_lines, args=(process, lines, log), daemon=True)
    reader.start()
    reason = ""
    while process.poll() is None:
        if time.monotonic() - started > timeout:
            reason = f"the image build took more than {timeout:.0f} s (sandbox.docker.build_timeout)"
        elif should_stop is not None and (stop := should_stop()):
            reason = f"the image build was stopped ({stop})"
        if reason:
            process.kill()
            break
        time.sleep(0.2)
    process.wait()
    reader.join(timeout=5)
    output = "\n".join(lines[-200:])
    if reason:
        raise ImageError(reason, output)
    if process.returncode != 0:
        last = next((line for line in reversed(lines) if line.strip()), "no output")
        raise ImageError(
            f"the task's image did not build (docker build exited {process.returncode}): {last}", output
        )
    log(f"built {reference} in {time.monotonic() - started:.1f} s")


def _read_lines(process: subprocess.Popen, lines: list[str], log: Callable[[str], None]) -> None:
    assert process.stdout is not None
    for raw in process.stdout:
        line = raw.decode("utf-8", "replace").rstrip("\n")[:LOG_LINE_CAP]
        lines.append(line)
        log(line)


def _pulled(remote: str, reference: str, log: Callable[[str], None]) -> bool:
    try:
        command.call(["pull", remote], timeout=600)
        command.call(["tag", remote, reference])
    except SandboxError as exc:
        log(f"{remote}: not in the registry yet ({str(exc)[-200:]}): building it here")
        return False
    log(f"pulled {remote}")
    return True


def _push(remote: str, reference: str, log: Callable[[str], None]) -> None:
    """Push a built image for the other hosts; a failed push is logged, not the trial's error
    (this host has the image, the others build it themselves)."""
    try:
        command.call(["tag", reference, remote])
        command.call(["push", remote], timeout=600)
    except SandboxError as exc:
        log(f"pushing {remote} failed, other hosts will build it: {str(exc)[-300:]}")
        return
    log(f"pushed {remote}")


def image_key_for(context: Path, dockerfile: str, build: Mapping) -> str:
    """The key of a Dockerfile's image: its build context's files and the build settings."""
    return image_key(context_files(context), dockerfile, dict(build))


def context_files(context: Path) -> dict[str, bytes]:
    """The build context's files by relative path (links by their target's text), for its key;
    a context over MAX_CONTEXT_BYTES is refused."""
    files: dict[str, bytes] = {}
    total = 0
    for dirpath, dirnames, filenames in os.walk(context):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            relative = str(path.relative_to(context))
            if path.is_symlink():
                files[relative] = b"link:" + os.readlink(path).encode()
                continue
            data = path.read_bytes()
            total += len(data)
            if total > MAX_CONTEXT_BYTES:
                raise ImageError(
                    f"the build context {context.name}/ holds more than {MAX_CONTEXT_BYTES >> 20} MB: "
                    "build a base image once and name it in the Dockerfile's FROM"
                )
            files[relative] = data + b"\0mode:" + oct(path.stat().st_mode & 0o777).encode()
    return files
