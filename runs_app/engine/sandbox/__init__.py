"""The sandbox room: where every command of a trial runs, and nothing else of the worker is.

One object per trial (or per run's suite), whatever runs it (`base.Sandbox`): start, exec a
command of a phase with that phase's limits and mounts, read and write files, stop, clean up.
One folder per driver: `bubblewrap/` (Linux namespaces on the worker host) and `docker/` (one
container per trial, from the task's image, on root workers with Debian's docker.io).

- `base`: the interface, mounts, limits, results, the scrubbed environment;
- `limits`: the one recipe for a command's limits, by phase;
- `process`: process control for any driver (launcher, cgroups, caps, stop, leftovers);
- `containment`: finding every process a command started; the leased sandbox uids;
- `filesystem`: a sandbox's own file system with its disk and inode caps;
- `workspace`: a sandbox's folders, template sources, snapshots, diffs, artifacts;
- `environments`: what the host builds once for many sandboxes (venvs, env_packages).

Pure Python, no Django: the engine passes the host's settings in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from runs_app.engine.sandbox import docker
from runs_app.engine.sandbox.base import (
    DEFAULT_ENV_ALLOWLIST,
    Limits,
    Mount,
    ProcessResult,
    Sandbox,
    SandboxError,
    SandboxPaths,
    SandboxUnavailable,
    build_env,
    redact,
    resolve_secrets,
)
from runs_app.engine.sandbox.bubblewrap import BubblewrapSandbox
from runs_app.engine.sandbox.docker import ContainerSandbox, Resources
from runs_app.engine.sandbox.filesystem import DiskCap
from runs_app.engine.sandbox.limits import Caps, Phase, phase_limits
from runs_app.engine.sandbox.workspace import WorkspaceError

__all__ = [
    "DEFAULT_ENV_ALLOWLIST",
    "DRIVERS",
    "Caps",
    "DiskCap",
    "Limits",
    "Mount",
    "Phase",
    "ProcessResult",
    "Resources",
    "Sandbox",
    "SandboxError",
    "SandboxPaths",
    "SandboxUnavailable",
    "WorkspaceError",
    "build_env",
    "discard",
    "open_sandbox",
    "phase_limits",
    "redact",
    "resolve_secrets",
]

DRIVERS: dict[str, Callable[..., Sandbox]] = {"bubblewrap": BubblewrapSandbox, "docker": ContainerSandbox}


def open_sandbox(
    driver: str,
    root: Path,
    *,
    stage_root: Path,
    shared: Sequence[Mount] = (),
    env: Mapping[str, str] | None = None,
    disk: DiskCap | None = None,
    **options: Any,
) -> Sandbox:
    """A sandbox of `driver` in the fresh folder `root`, not started yet. `stage_root` is where
    the host keeps what its sandboxes share (staged runtimes); `disk` caps what its folders may
    hold, in every phase. `options` are the driver's own (the container driver's image, user,
    workdir, in_image, resources, mount_roots: `ContainerSandbox`)."""
    if driver not in DRIVERS:
        raise SandboxError(f"no sandbox driver {driver!r} on this worker (drivers: {', '.join(DRIVERS)})")
    return DRIVERS[driver](root, stage_root=stage_root, shared=shared, env=env, disk=disk, **options)


def discard(root: Path) -> None:
    """Remove a sandbox's folder that no worker holds any more (its worker died), with whatever
    of it still runs (a container sandbox's container too)."""
    if (root / "mounts").is_dir():  # a container sandbox's skeleton (`docker.mounts`)
        docker.discard(root)
    else:
        BubblewrapSandbox(root).cleanup()
