"""What every sandbox driver shares: the object's life cycle, mounts, limits, results, the
scrubbed environment.

A `Sandbox` is one trial's (or one suite's) isolated place to run commands:

1. `start()` makes its folders (workspace, HOME, /tmp) and whatever the driver needs to run in
   them (a leased uid for bubblewrap; a container for a container engine);
2. `exec(argv, limits=..., env=..., mounts=...)` runs one command of a phase inside it, with
   that phase's limits and the mounts that phase may see, and returns how it ended;
3. `read_file` / `write_file` move files in and out of the workspace as the sandbox's user;
   `pull_workspace()` gives it as a host folder (snapshots, diffs, artifacts), and
   `command_path(path)` says where commands see a host path of the sandbox;
4. `stop()` kills whatever of the sandbox still runs; `cleanup()` also removes its folders
   (and gives back what `start` took). Both may be called more than once, in any state.

Callers never know which driver runs them: they build a sandbox with `open_sandbox` (in
`runs_app.engine.sandbox`) and speak only this interface. Pure Python, no Django.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

DEFAULT_ENV_ALLOWLIST: tuple[str, ...] = (
    "PATH",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "TERM",
    "TZ",
    # Corporate networks: agents must reach their model API through the same proxy and CAs.
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
)


class SandboxError(RuntimeError):
    """The sandbox could not be set up (no free uid, unwritable cgroup, missing secret...)."""


class SandboxUnavailable(RuntimeError):
    """The driver cannot run here (bwrap missing, no namespaces); the message says what to install."""


@dataclass(frozen=True)
class Mount:
    """A host path visible in the sandbox at the same path (read-only unless `writable`), or,
    `hidden`, an empty folder in place of a path a wider mount shows (a task bundle's
    reference solution, for commands that run the agent's code)."""

    path: Path
    writable: bool = False
    hidden: bool = False
    # The host folder shown at `path`, when it is another (the task's venv over the workspace's).
    source: Path | None = None


@dataclass(frozen=True)
class SandboxPaths:
    root: Path
    workspace: Path
    home: Path
    tmp: Path
    uid: int | None  # the uid leased to this sandbox (root workers), else None


@dataclass
class Limits:
    """Resource limits of one command. None means "no cap" for the optional ones.

    `max_processes` counts threads too (both `RLIMIT_NPROC` and `pids.max` do): a Node or Go
    CLI needs a few hundred. `address_space_bytes` must stay None (or very large) for agent
    CLIs: V8, Go and Rust runtimes reserve tens of GB of virtual memory up front.
    """

    wall_seconds: float = 600.0
    cpu_seconds: int | None = None
    address_space_bytes: int | None = None
    max_processes: int | None = 512
    max_file_bytes: int | None = None
    # The memory cgroup's cap on the command's whole tree (RLIMIT_DATA where no cgroup can be made).
    memory_bytes: int | None = None
    stdout_cap_bytes: int = 1 << 20
    stderr_cap_bytes: int = 256 << 10
    kill_grace_seconds: float = 2.0


@dataclass
class ProcessResult:
    """How a command ended. `exit_code` is None when a signal ended it (`signal` says which).

    `timed_out`: the wall clock ran out. `cancelled`: `should_stop` returned a reason (kept in
    `stop_reason`, e.g. "cancelled" or "budget"). `killed`: the main process outlived SIGTERM
    by the grace period and got SIGKILL. `leftovers_killed`: processes still running after the
    main one ended, killed by the harness.
    """

    exit_code: int | None
    signal: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool
    cancelled: bool
    killed: bool
    duration_seconds: float
    stop_reason: str | None = None
    stdout_total_bytes: int = 0
    stderr_total_bytes: int = 0
    leftovers_killed: int = 0
    memory_exhausted: bool = False  # the memory cap was reached (allocations refused or OOM-killed)


class Sandbox:
    """One sandbox (see the module docstring). Drivers implement `start`, `exec`, `stop` and
    `cleanup`; files go through the host folders every driver mounts."""

    driver: ClassVar[str] = ""

    def __init__(self, root: Path, *, shared: Sequence[Mount] = (), env: Mapping[str, str] | None = None):
        self.root = root
        # Mounts every command of the sandbox sees (HOME, the host's task environments, a
        # run's suite folder), besides what a phase adds.
        self.shared: list[Mount] = list(shared)
        # Variables every command gets, besides the allowlisted ones and a phase's own.
        self.env: dict[str, str] = dict(env or {})
        self.paths: SandboxPaths | None = None

    # --- life cycle (the driver's) --------------------------------------------------------------

    def start(self) -> SandboxPaths:
        raise NotImplementedError

    def exec(
        self,
        argv: list[str] | str,
        *,
        limits: Limits,
        env: Mapping[str, str] | None = None,
        mounts: Sequence[Mount] = (),
        stdin: bytes | None = None,
        on_stdout_line: Callable[[str], None] | None = None,
        should_stop: Callable[[], str | None] | None = None,
        poll_interval: float = 0.25,
        fresh_home: bool = False,
    ) -> ProcessResult:
        """Run one command: a str through `/bin/sh -c`, in the workspace, with `limits`, the
        shared mounts plus `mounts`, and the scrubbed environment plus `env` (see `environment`).
        Every stdout line goes to `on_stdout_line` as it comes; `should_stop` is polled every
        `poll_interval` seconds and a reason stops the command (SIGTERM, then SIGKILL).
        `fresh_home`: an empty HOME and /tmp of its own instead of the sandbox's, removed after
        (a grader must not run what earlier commands left there)."""
        raise NotImplementedError

    def stop(self) -> None:
        """Kill whatever of the sandbox still runs."""

    def disk_exceeded(self) -> bool:
        """Whether the sandbox holds its disk or inode cap (then the caller stops its command)."""
        return False

    def cleanup(self) -> None:
        """Stop, remove the sandbox's folders and give back what `start` took."""
        raise NotImplementedError

    # --- shared by every driver -----------------------------------------------------------------

    @property
    def started(self) -> SandboxPaths:
        if self.paths is None:
            raise SandboxError("the sandbox has not been started")
        return self.paths

    def environment(self, extra: Mapping[str, str] | None = None, home: Path | None = None) -> dict[str, str]:
        """The variables a command sees: the allowlisted ones of the worker, HOME (the
        sandbox's, or `home`) and TMPDIR, the sandbox's own (`self.env`), then `extra`."""
        paths = self.started
        return build_env(
            home=home or paths.home, tmpdir=paths.tmp, allowlist=DEFAULT_ENV_ALLOWLIST, secrets={},
            extra={**self.env, **(extra or {})},
        )  # fmt: skip

    def read_file(self, relative: str, max_bytes: int = 64 << 20) -> bytes:
        """A workspace file's bytes (at most `max_bytes`), never through a link leaving it."""
        path = self._inside(relative)
        with open(path, "rb") as handle:
            return handle.read(max_bytes)

    def write_file(self, relative: str, data: bytes) -> Path:
        """Write a workspace file, owned by the sandbox's user; returns its host path."""
        path = self._inside(relative)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        uid = self.started.uid
        if uid is not None:
            os.lchown(path, uid, uid)
        return path

    def pull_workspace(self) -> Path:
        """The workspace as a host folder, as it is now: what snapshots, diffs and artifacts
        read. Here the host folder is the workspace; a driver whose workspace lives elsewhere
        (a container's own folder) copies it there first."""
        return self.started.workspace

    def command_path(self, path: Path) -> Path:
        """Where the sandbox's commands see `path`, a host path of the sandbox (a driver may
        show the workspace elsewhere): for the variables that name paths."""
        return path

    def _inside(self, relative: str) -> Path:
        workspace = self.started.workspace
        path = (workspace / relative).resolve()
        if not path.is_relative_to(workspace.resolve()):
            raise SandboxError(f"{relative!r} leaves the sandbox's workspace")
        return path


# ---------------------------------------------------------------------------------------------
# Environment and secrets


def build_env(
    *,
    home: Path,
    tmpdir: Path,
    allowlist: Iterable[str],
    secrets: Mapping[str, str],
    extra: Mapping[str, str],
) -> dict[str, str]:
    """A scrubbed environment: allowlisted worker variables, sandbox HOME/TMPDIR, secrets, extra.

    Nothing else from the worker's environment leaks in (its API keys in particular: only the
    secrets a variant names are passed).
    """
    env = {name: os.environ[name] for name in allowlist if name in os.environ}
    env.update(HOME=str(home), TMPDIR=str(tmpdir), TMP=str(tmpdir), TEMP=str(tmpdir))
    env.update(secrets)
    env.update(extra)
    return env


def resolve_secrets(names: Iterable[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Values of the named secrets from the worker's environment; raises naming what to set."""
    environ = os.environ if environ is None else environ
    names = list(names)
    missing = [name for name in names if not environ.get(name)]
    if missing:
        raise SandboxError(
            f"secret(s) {', '.join(missing)} not set in the worker's environment: "
            "export them where the worker starts (they are never stored in the database)"
        )
    return {name: environ[name] for name in names}


def redact(text: str, secrets: Iterable[str]) -> str:
    """`text` with every non-empty secret value replaced by `***` (longest first)."""
    for value in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(value, "***")
    return text
