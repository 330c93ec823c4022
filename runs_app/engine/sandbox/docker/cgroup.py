"""A running container as the host sees it through its PID 1: its processes, its cgroups (pids
and memory, v1 or v2, whatever the engine's cgroup driver), its out-of-memory kills, and its user
namespace's mapping. Read from /proc and /sys on the host (root workers).

Pure Python, Linux only, no Django.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from runs_app.engine.sandbox.base import SandboxError


def _cgroup_mounts() -> tuple[dict[str, Path], Path | None]:
    """{v1 controller: mount point} and the cgroup2 mount point, if any."""
    v1: dict[str, Path] = {}
    v2 = None
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            head, _, tail = line.partition(" - ")
            fields, kind = head.split(), tail.split()
            if kind[0] == "cgroup2":
                v2 = v2 or Path(fields[4])
            elif kind[0] == "cgroup":
                for option in kind[2].split(","):
                    v1.setdefault(option, Path(fields[4]))
    return v1, v2


def init_pid_of(container_id: str) -> int | None:
    """The host pid of a just-started container's PID 1, read from its cgroup (the engine's
    cgroupfs or systemd layout, v1 or v2) instead of asking the engine; None when the layout
    is another or the cgroup holds more than one process (the caller asks the engine then)."""
    v1, v2 = _cgroup_mounts()
    bases = [base for base in (v1.get("pids"), v2) if base is not None]
    for base in bases:
        for relative in (f"docker/{container_id}", f"system.slice/docker-{container_id}.scope"):
            try:
                procs = (base / relative / "cgroup.procs").read_text().split()
            except OSError:
                continue
            return int(procs[0]) if len(procs) == 1 else None
    return None


class ContainerCgroup:
    """The cgroups of the container whose PID 1 is `init_pid` (a host pid)."""

    def __init__(self, init_pid: int):
        self.init_pid = init_pid
        v1, v2 = _cgroup_mounts()
        self.pids: Path | None = None
        self.memory: Path | None = None
        self.v2 = False
        with open(f"/proc/{init_pid}/cgroup") as handle:
            for line in handle:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                relative = path.lstrip("/")
                names = set(controllers.split(","))
                if "pids" in names and "pids" in v1:
                    self.pids = v1["pids"] / relative
                if "memory" in names and "memory" in v1:
                    self.memory = v1["memory"] / relative
                if controllers == "" and v2 is not None and (self.pids is None or self.memory is None):
                    unified = v2 / relative
                    if (unified / "pids.max").exists() and self.pids is None:
                        self.pids, self.v2 = unified, True
                    if (unified / "memory.max").exists() and self.memory is None:
                        self.memory, self.v2 = unified, True
        if self.pids is None:
            raise SandboxError(f"the container of pid {init_pid} has no pids cgroup the worker can read")

    # --- processes ------------------------------------------------------------------------------

    def processes(self) -> set[int]:
        """Host pids of the container's live processes but its PID 1."""
        assert self.pids is not None
        try:
            text = (self.pids / "cgroup.procs").read_text()
        except FileNotFoundError:
            return set()  # the container is gone
        found = set()
        for word in text.split():
            pid = int(word)
            if pid != self.init_pid and _alive(pid):
                found.add(pid)
        return found

    def kill_all(self, grace: float | None = None) -> tuple[int, bool]:
        """End every process of the container but its PID 1: SIGTERM and up to `grace` seconds
        to exit, then SIGKILL until none is left. (processes ended, whether SIGKILL was needed)"""
        ended = self.processes()
        if not ended:
            return 0, False
        if grace is not None:
            _signal_all(ended, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                left = self.processes()
                if not left:
                    return len(ended), False
                ended |= left
                time.sleep(0.02)
        pause, deadline = 0.002, time.monotonic() + 10.0
        needed_kill = False
        while True:
            left = self.processes()
            if not left:
                return len(ended), needed_kill
            if time.monotonic() > deadline:
                raise SandboxError(f"{len(left)} processes of the container outlived SIGKILL for 10 s")
            needed_kill = True
            ended |= left
            _signal_all(left, signal.SIGKILL)
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    # --- memory and pids ------------------------------------------------------------------------

    def oom_kills(self) -> int:
        """How many processes the kernel killed at the container's memory cap so far."""
        if self.memory is None:
            return 0
        name = "memory.events" if self.v2 else "memory.oom_control"
        with contextlib.suppress(OSError):
            for line in (self.memory / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def limit_file(self, kind: str) -> Path | None:
        """The file of the container's "memory" or "pids" cap (None: no such controller)."""
        if kind == "pids":
            return self.pids / "pids.max" if self.pids is not None else None
        if self.memory is None:
            return None
        return self.memory / ("memory.max" if self.v2 else "memory.limit_in_bytes")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return False
    return data[data.rfind(b")") + 2 : data.rfind(b")") + 3] not in (b"Z", b"X")


def _signal_all(pids: set[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def host_identity(init_pid: int) -> tuple[int, int]:
    """(uid, gid) on the host of the container's user (its PID 1's): the owner its folders need
    (the same ids without a user namespace; shifted by the engine's userns-remap)."""
    uid = gid = None
    with open(f"/proc/{init_pid}/status") as handle:
        for line in handle:
            if line.startswith("Uid:"):
                uid = int(line.split()[1])
            elif line.startswith("Gid:"):
                gid = int(line.split()[1])
    if uid is None or gid is None:
        raise SandboxError(f"cannot read the identity of the container's pid {init_pid}")
    return uid, gid


def remapped(init_pid: int) -> bool:
    """Whether the container runs in a user namespace of its own (root inside is not root
    outside): its uid map is not the identity of the whole range."""
    with open(f"/proc/{init_pid}/uid_map") as handle:
        rows = [line.split() for line in handle if line.strip()]
    return rows != [["0", "0", "4294967295"]]
