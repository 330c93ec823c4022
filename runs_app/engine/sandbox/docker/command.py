"""The container driver's command lines: the engine's client, the `docker run` that starts a
trial's container, the `docker exec` of each command, and the static program every container
gets at /.evalsite/box (`box.c`: its PID 1, and what sets a command's resource limits before it
execs).

The client is Debian's `/usr/bin/docker` (20.10, like the engine), not the one first on PATH:
`EVALSITE_DOCKER` names another. It runs with an environment of its own (an empty
configuration folder, the worker's DOCKER_HOST): never a command's variables, which go through
an env file, so no variable of a task (LD_PRELOAD, DOCKER_CONFIG, a proxy) steers the client.

Pure Python, no Django.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from runs_app.engine.sandbox import process
from runs_app.engine.sandbox.base import SandboxError, SandboxUnavailable

LABEL = "evalsite.sandbox"  # every container of the driver carries it; reap() lists by it
ROOT_LABEL = "evalsite.root"  # the trial folder (host path) the container belongs to
WORKER_LABEL = "evalsite.worker"  # "<host>:<pid>" of the worker process that started it
HELPERS = PurePosixPath("/.evalsite")  # the static program, read-only, in every container
# The engine refuses more (CONTAINERS.md); agent CLIs (Node) open many files.
NOFILE = 20_000
# What root needs in a task's image to install packages and own files (dpkg, apt, pip):
# change owners and modes whatever the file's owner, drop to apt's user; and bind a port below
# 1024 on the container's own loopback (a test server on :80). Nothing else of Docker's default
# set: no MKNOD, NET_RAW, SETFCAP, SETPCAP, SYS_CHROOT, KILL, AUDIT_WRITE.
ROOT_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID", "NET_BIND_SERVICE")
CALL_TIMEOUT = 120.0

_SOURCE = Path(__file__).with_name("box.c")
_BUILD_LOCK = threading.Lock()


def docker_binary() -> str:
    found = os.environ.get("EVALSITE_DOCKER") or (
        "/usr/bin/docker" if Path("/usr/bin/docker").exists() else None
    )
    found = found or shutil.which("docker")
    if not found:
        raise SandboxUnavailable(
            "no container engine client on this worker: container tasks need Debian's docker.io "
            "(`make containers` installs and starts it)"
        )
    return found


@functools.cache
def _config_dir() -> Path:
    # Beside the launcher (the worker's own build folder), not under /tmp, where a sandboxed
    # process could plant a configuration first.
    folder = process.LAUNCHER.parent / "docker-config"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


def client_env() -> dict[str, str]:
    """The client's whole environment: an empty configuration (no context, no credential
    helper, no plugin) and the worker's engine address."""
    config = str(_config_dir())
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": config, "DOCKER_CONFIG": config}
    if os.environ.get("DOCKER_HOST"):
        env["DOCKER_HOST"] = os.environ["DOCKER_HOST"]
    return env


def call(args: Sequence[str], *, timeout: float = CALL_TIMEOUT) -> bytes:
    """One client command (`docker ARGS`); its stdout, or SandboxError with its stderr."""
    try:
        done = subprocess.run(
            [docker_binary(), *args], capture_output=True, timeout=timeout, env=client_env(),
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise SandboxError(
            f"`docker {args[0]}` did not answer in {timeout:.0f} s: is dockerd alive?"
        ) from None
    if done.returncode != 0:
        message = done.stderr.decode("utf-8", "replace").strip()[-800:]
        raise SandboxError(f"`docker {' '.join(args[:2])}` failed: {message}")
    return done.stdout


@functools.cache
def _helpers_dir() -> Path:
    return process.LAUNCHER.parent / "container"


def helpers() -> Path:
    """The folder mounted at /.evalsite, with `box` built when missing or older than its
    source (static: it runs in images without the worker's C library)."""
    folder = _helpers_dir()
    target = folder / "box"
    with _BUILD_LOCK:
        if not target.exists() or target.stat().st_mtime < _SOURCE.stat().st_mtime:
            folder.mkdir(parents=True, exist_ok=True)
            os.chmod(folder, 0o755)
            _compile_static(_SOURCE, target)
    return folder


def _compile_static(source: Path, target: Path) -> None:
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        raise SandboxError(f"no C compiler to build {target}: install gcc (and libc6-dev, for -static)")
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    built = subprocess.run(
        [compiler, "-static", "-O2", "-o", str(partial), str(source)], capture_output=True, text=True
    )  # fmt: skip
    if built.returncode != 0:
        raise SandboxError(f"building {target} (static) failed: {built.stderr.strip()[-500:]}")
    os.chmod(partial, 0o755)
    os.replace(partial, target)


def run_args(
    *,
    name: str,
    image: str,
    user: str,
    labels: Mapping[str, str],
    memory_bytes: int | None,
    cpus: float | None,
    pids: int | None,
    read_only: bool,
    skeletons: Sequence[tuple[Path, PurePosixPath]],
    workdir: PurePosixPath | None = None,
) -> list[str]:
    """`docker run` of a trial's container: idle under its own PID 1 until the trial ends.
    `workdir`: the image's folder that is the workspace, made by the engine if the image lacks it
    (as `docker run -w` does for coder-eval), so that an empty workspace still exists."""
    root = user.split(":")[0] in ("0", "root")
    args = [
        "run", "--detach", "--pull", "never", "--name", name, "--hostname", "sandbox",
        "--network", "none", "--ipc", "private", "--log-driver", "none",
        "--user", user, "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
        "--ulimit", f"nofile={NOFILE}:{NOFILE}", "--ulimit", "core=0",
        "--entrypoint", str(HELPERS / "box"),
        "--mount", f"type=bind,src={helpers()},dst={HELPERS},readonly",
    ]  # fmt: skip
    for capability in ROOT_CAPABILITIES if root else ():
        args += ["--cap-add", capability]
    for key, value in labels.items():
        args += ["--label", f"{key}={value}"]
    if memory_bytes is not None:
        args += ["--memory", str(memory_bytes), "--memory-swap", str(memory_bytes)]
    if cpus is not None:
        args += ["--cpus", f"{cpus:g}"]
    if pids is not None:
        args += ["--pids-limit", str(pids)]
    if read_only:
        args.append("--read-only")
    if workdir is not None:
        args += ["--workdir", str(workdir)]
    for source, target in skeletons:
        args += ["--mount", f"type=bind,src={source},dst={target},readonly,bind-propagation=rslave"]
    return [*args, image, "init"]


def exec_args(
    *,
    name: str,
    argv: Sequence[str],
    workdir: PurePosixPath,
    env_file: Path,
    inline_env: Mapping[str, str],
    limit_options: Sequence[str],
    stdin: bool,
    user: str | None = None,
) -> list[str]:
    """`docker exec` of one command, its rlimits set by `box run` in the container; as `user`
    when given (a verifier's), else as the container's user."""
    args = [docker_binary(), "exec", *(["--interactive"] if stdin else []), "--workdir", str(workdir)]
    if user is not None:
        args += ["--user", user]
    args += ["--env-file", str(env_file)]
    for key, value in inline_env.items():  # values an env file cannot hold (a newline)
        args += ["--env", f"{key}={value}"]
    return [*args, name, str(HELPERS / "box"), "run", *limit_options, "--", *argv]


def write_env_file(path: Path, env: Mapping[str, str]) -> dict[str, str]:
    """Write what an env file can hold (0600); return the rest (values with a newline)."""
    inline = {key: value for key, value in env.items() if "\n" in value or "\r" in value}
    lines = [f"{key}={value}\n" for key, value in env.items() if key not in inline]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.writelines(lines)
    return inline
