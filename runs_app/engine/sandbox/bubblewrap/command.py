"""The bubblewrap driver's command line: the `bwrap` argv of one sandboxed command.

Each command gets new mount, PID, IPC, UTS, user, cgroup and network namespaces. The network
namespace has loopback only; the model is reached through the trial's gateway (`gateway`).
Inside, the file system is a fresh tmpfs holding only:

- the system, read-only: /usr and /etc (and the /bin, /lib... links or folders beside them);
- the language runtimes and agent CLIs the worker uses, read-only, at the paths they have on
  the worker (its Python, its virtualenv, the project's node_modules and .agents,
  `SANDBOX_RUNTIME_DIRS`);
- what the caller mounts: the trial's workspace, HOME and /tmp (writable), and, only in the
  phase that needs them, the task's files and reference solution (read-only);
- its own /proc (of its PID namespace) and a minimal /dev.

Nothing else of the worker exists there: not its database, broker folders, `var/`, checkout,
other trials, nor other processes. When the command's main process ends, bwrap ends and the
kernel kills everything left in its PID namespace.

A root worker runs bwrap as the trial's leased uid (unprivileged, through a user namespace), so
the sandbox never holds root's file access. An unprivileged bwrap resolves every mount source
by path, so a runtime under a folder that uid cannot search (a checkout in a 0700 home) is first
staged: hard-linked once into a searchable folder under the sandbox root, then mounted at its
real path. Pure Python, no Django.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

from runs_app.engine.sandbox.base import Mount, SandboxUnavailable

# The folders beside /usr that merged-/usr systems make links (and older ones real folders).
_TOP_LEVEL = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
PROJECT_ROOT = Path(__file__).resolve().parents[4]
# Where a root worker stages runtimes its sandbox uid cannot reach (beside the trial folders).
DEFAULT_STAGE_ROOT = Path(os.environ.get("SANDBOX_ROOT") or "/var/tmp/evalsite-sandboxes") / "runtimes"
_STAGE_LOCK = threading.Lock()
_STAGED: dict[tuple[str, str], Path] = {}


def bwrap_binary() -> str:
    found = os.environ.get("EVALSITE_BWRAP") or shutil.which("bwrap")
    if not found:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is not installed on this worker: every trial command runs in its "
            "sandbox. Install it (Debian/Ubuntu: apt-get install bubblewrap; `make test` does it)"
        )
    return found


@functools.cache
def runtime_dirs() -> tuple[Path, ...]:
    """The worker's runtimes the sandbox sees read-only: its Python (and virtualenv), the agent
    CLIs of the project's node_modules, and the folders listed in SANDBOX_RUNTIME_DIRS (read
    once per worker process)."""
    dirs = [Path(sys.base_prefix), Path(sys.prefix), PROJECT_ROOT / "node_modules", PROJECT_ROOT / ".agents"]
    for name in sorted(os.environ):  # an agent kind's CLI, wherever the worker keeps it
        if name.startswith("EVALSITE_") and name.endswith("_BIN") and os.environ[name]:
            dirs.append(Path(os.environ[name]).resolve().parent)
    dirs += [Path(p) for p in os.environ.get("SANDBOX_RUNTIME_DIRS", "").split(":") if p]
    kept: list[Path] = []
    for folder in dirs:
        folder = folder.resolve()
        if folder.is_dir() and not _under(folder, Path("/usr")) and folder not in kept:
            kept.append(folder)
    return tuple(kept)


def _under(path: Path, parent: Path) -> bool:
    return path == parent or path.is_relative_to(parent)


@functools.cache
def searchable_by_others(path: Path) -> bool:
    """Whether any uid can reach `path` (every folder on the way has o+x, the folder itself o+rx)."""
    for folder in [*reversed(path.parents), path]:
        mode = os.stat(folder).st_mode
        if not mode & stat.S_IXOTH:
            return False
    return bool(os.stat(path).st_mode & stat.S_IROTH)


def staged(folder: Path, stage_root: Path) -> Path:
    """A searchable copy of `folder` (hard links, so instant and free on one file system; a copy
    otherwise), made once per folder version and shared by every worker process on the host."""
    key = (str(folder), str(folder.stat().st_mtime_ns))
    with _STAGE_LOCK:
        if key in _STAGED and _STAGED[key].exists():
            return _STAGED[key]
        name = hashlib.sha256("\0".join(key).encode()).hexdigest()[:16]
        target = stage_root / f"{folder.name}-{name}"
        if not target.exists():
            stage_root.mkdir(parents=True, exist_ok=True)
            os.chmod(stage_root, 0o711)
            partial = stage_root / f".{target.name}.{os.getpid()}"
            shutil.rmtree(partial, ignore_errors=True)
            copied = subprocess.run(["cp", "-al", str(folder), str(partial)], capture_output=True)
            if copied.returncode != 0:
                shutil.rmtree(partial, ignore_errors=True)
                shutil.copytree(folder, partial, symlinks=True)
            _open_up(partial)
            try:
                partial.rename(target)
            except OSError:  # another process staged it first
                shutil.rmtree(partial, ignore_errors=True)
        _STAGED[key] = target
        return target


def _open_up(root: Path) -> None:
    """Folders of a staged copy are made searchable (files keep their own modes and owners)."""
    for dirpath, dirnames, _ in os.walk(root):
        os.chmod(dirpath, 0o755)
        for name in dirnames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                os.chmod(path, 0o755)


@functools.cache
def _system_args() -> tuple[str, ...]:
    args = ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for name in _TOP_LEVEL:
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    return tuple(args)


def command_line(
    command: Sequence[str],
    *,
    cwd: Path,
    mounts: Iterable[Mount] = (),
    tmp: Path | None = None,
    stage_root: Path | None = None,
) -> list[str]:
    """The bwrap argv that runs `command` in `cwd` (mounted writable) inside a fresh sandbox.

    `tmp` becomes the sandbox's /tmp (else an empty tmpfs). With `stage_root`, runtimes that other
    uids cannot reach are staged there first (root workers, which run bwrap as the leased uid).
    """
    args = [
        bwrap_binary(), "--unshare-all", "--unshare-user", "--die-with-parent", "--hostname", "sandbox",
        "--proc", "/proc", "--dev", "/dev", *_system_args(),
    ]  # fmt: skip
    args += ["--bind", str(tmp), "/tmp"] if tmp is not None else ["--tmpfs", "/tmp"]
    for folder in runtime_dirs():
        source = folder
        if stage_root is not None and not searchable_by_others(folder):
            source = staged(folder, stage_root)
        args += ["--ro-bind", str(source), str(folder)]
    for mount in [Mount(Path(cwd), writable=True), *mounts]:
        if mount.hidden:
            args += ["--tmpfs", str(mount.path)]
        else:
            source = mount.source or mount.path
            args += ["--bind" if mount.writable else "--ro-bind", str(source), str(mount.path)]
    args += ["--chdir", str(cwd), "--", *command]
    return args
