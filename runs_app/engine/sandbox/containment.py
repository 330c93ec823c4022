"""Containment: finding and killing every process one sandboxed command started.

Containment, strongest first (the first one available is used to find leftovers):

1. A per-call `pids` cgroup (v1 `pids` hierarchy, or a cgroup v2 subtree with the `pids`
   controller) when the worker can write one: `pids.max` caps processes *and threads* of the
   whole tree, and the cgroup's member list finds every leftover, even one that called setsid
   and cleared its environment.
2. A sandbox uid leased to this trial (workers running as root): the child drops to it, so
   `RLIMIT_NPROC` is enforced (the kernel ignores it for uid 0) and every process with that uid
   belongs to this trial.
3. Otherwise (a non-root worker without cgroups): the session and process group of the main
   process, their descendants, and any process whose environment carries this call's
   `EVALSITE_SANDBOX_ID` token. A process that leaves the session *and* clears its environment
   escapes this last mode; the two above do not have that hole.

A root worker never runs sandboxed commands as root: the child runs as the owner of its working
directory (the leased uid `workspace.layout` gives the trial's folders), or as the user named by
`EVALSITE_SANDBOX_USER` (default `nobody`) when the directory belongs to root.

`process.run` is the one caller of the cgroup and containment classes here. Pure Python,
Linux only, no Django.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import logging
import os
import pwd
import secrets
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from runs_app.engine.sandbox.base import SandboxError

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# /proc helpers


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _proc_stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, pgid, sid) of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: fields start after the last ")".
    fields = data[data.rfind(b")") + 2 :].split()
    return fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3])


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    stat = _proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def _status_field(pid: int, field: bytes) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/status", "rb", buffering=0) as f:
            data = f.read(4096)
    except OSError:
        return None
    start = data.find(b"\n" + field)
    if start < 0:
        return None
    end = data.find(b"\n", start + 1)
    return data[start + 1 : end if end > 0 else None].split()[1:]


def _pids_of_uid(uid: int) -> set[int]:
    """Live processes whose *real* uid is `uid` (a setuid binary changes only the effective one)."""
    found = set()
    for pid in _all_pids():
        uids = _status_field(pid, b"Uid:")
        if uids and int(uids[0]) == uid and _alive(pid):
            found.add(pid)
    return found


def tasks_of_uid(uid: int) -> int:
    """Threads owned by `uid`, zombies included: what the kernel compares with RLIMIT_NPROC."""
    total = 0
    for pid in _all_pids():
        uids = _status_field(pid, b"Uid:")
        if uids and int(uids[0]) == uid:
            threads = _status_field(pid, b"Threads:")
            total += int(threads[0]) if threads else 1
    return total


def _tree_members(leader: int, token: bytes) -> set[int]:
    """Session/group members of `leader`, processes carrying `token`, and their descendants.

    Safe against pid reuse: the kernel never hands out a pid that is still some process's
    process-group or session id.
    """
    me = os.getpid()
    children: dict[int, list[int]] = {}
    members = set()
    for pid in _all_pids():
        stat = _proc_stat(pid)
        if stat is None or stat[0] in ("Z", "X") or pid == me:
            continue
        state, ppid, pgid, sid = stat
        children.setdefault(ppid, []).append(pid)
        if pgid == leader or sid == leader or _environ_has(pid, token):
            members.add(pid)
    stack = [leader, *members]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in members:
                members.add(child)
                stack.append(child)
    return members


def _environ_has(pid: int, token: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return token in f.read()
    except OSError:
        return False


def _kill_until_gone(find: Callable[[], set[int]], timeout: float = 5.0) -> int:
    """SIGKILL whatever `find` returns until it returns nothing; the number of processes killed."""
    return _sweep(find, timeout)[0]


def _sweep(find: Callable[[], set[int]], timeout: float = 5.0) -> tuple[int, bool]:
    """(processes killed, whether none was left when it stopped).

    Repeats because a process may fork between the listing and the kill; the process cap keeps
    the number of rounds small.
    """
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    pause = 0.0001  # a process just killed is usually gone within a tenth of a millisecond
    while True:
        pids = find() - {os.getpid()}
        if not pids or time.monotonic() > deadline:
            return len(killed), not pids
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed |= pids
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def kill_uid_processes(uid: int) -> int:
    """Kill every process running as `uid` (only meaningful for a uid leased to one trial)."""
    return _kill_until_gone(lambda: _pids_of_uid(uid))


# ---------------------------------------------------------------------------------------------
# Sandbox uids (root workers)

_CLEAN = b"clean"
_UID_LOCK = threading.Lock()
_LEASES: dict[int, int] = {}  # uid -> fd of its lock file, held while the trial lives
# Leased uids a process may still run as: a command of theirs ran outside a pids cgroup (a
# process cannot leave one: moving needs write access to another cgroup's files). Only these
# are swept by a scan of /proc when released; the others were emptied with their cgroups.
_UNSWEPT: set[int] = set()


def _uid_range() -> range:
    """`EVALSITE_SANDBOX_UIDS` as "first-last": one uid per trial in flight on the host, shared
    by its worker processes (default 64000-65023, 1,024 trials; no system account there, and
    65534 is nobody's)."""
    spec = os.environ.get("EVALSITE_SANDBOX_UIDS", "64000-65023")
    try:
        first, last = (int(part) for part in spec.split("-"))
    except ValueError:
        raise SandboxError(
            f"EVALSITE_SANDBOX_UIDS={spec!r}: expected 'first-last', e.g. 64000-64255"
        ) from None
    if not 0 < first <= last:
        raise SandboxError(f"EVALSITE_SANDBOX_UIDS={spec!r}: expected 0 < first <= last")
    return range(first, last + 1)


def _lock_dir() -> Path:
    # /tmp is world-writable: a sandboxed process must not be able to plant this folder first.
    path = Path(tempfile.gettempdir()) / "evalsite-uid-locks"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    st = path.lstat()
    if st.st_uid != os.geteuid() or not path.is_dir() or path.is_symlink() or st.st_mode & 0o077:
        raise SandboxError(f"{path} is not a private folder of uid {os.geteuid()}: remove it")
    return path


def lease_sandbox_uid() -> int:
    """Reserve a uid for one trial (root only) until `release_sandbox_uid`.

    The reservation is an flock on a lock file, so it holds across worker processes and ends by
    itself when the worker dies. Processes left over from a dead worker's trial under the same
    uid are killed before the uid is handed out again.
    """
    uids = list(_uid_range())
    start = (os.getpid() * 7919 + time.monotonic_ns()) % len(uids)  # spread workers apart
    lock_dir = _lock_dir()
    with _UID_LOCK:
        if not _PRIMED:
            _prime_lock_files(lock_dir, uids)
            _PRIMED.append(True)
        for uid in uids[start:] + uids[:start]:
            if uid in _LEASES:
                continue
            fd = os.open(lock_dir / str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            _LEASES[uid] = fd
            break
        else:
            raise SandboxError(f"no free sandbox uid in {uids[0]}-{uids[-1]}: widen EVALSITE_SANDBOX_UIDS")
    # The lock file says "clean" when the last holder released the uid after its final sweep;
    # anything else (a worker died holding it) means leftovers may still run as this uid.
    was_clean = os.pread(fd, 16, 0) == _CLEAN
    os.ftruncate(fd, 0)
    if was_clean:
        return uid
    kill_uid_processes(uid)
    # Killed processes stay zombies until init reaps them, and zombies count for RLIMIT_NPROC:
    # give init a moment so the trial starts with its whole process budget.
    deadline = time.monotonic() + 1.0
    while tasks_of_uid(uid) and time.monotonic() < deadline:
        time.sleep(0.01)
    return uid


_PRIMED: list[bool] = []  # once per process


def _prime_lock_files(lock_dir: Path, uids: list[int]) -> None:
    """Create the lock file of every uid of the range that has none yet, marked clean when no
    process runs as that uid (one scan of /proc for the whole range): on a fresh host, each
    uid's first lease otherwise scanned /proc for leftovers, a few ms a trial for the first
    thousand trials. A file that exists is left as it is: its holder or its content speaks
    for it. Done once per range on a host (a marker file), then once per process a check.
    """
    marker = lock_dir / f".primed-{uids[0]}-{uids[-1]}"
    if marker.exists():
        return
    wanted = set(uids)
    busy = set()  # zombies too: they count against the next holder's process limit
    for pid in _all_pids():
        found = _status_field(pid, b"Uid:")
        if found and int(found[0]) in wanted:
            busy.add(int(found[0]))
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for uid in uids:
        try:
            fd = os.open(lock_dir / str(uid), flags, 0o600)
        except FileExistsError:
            continue
        try:
            # A file this process created: nobody leased the uid since the folder was made,
            # so what runs as it now is all there is; a concurrent leaser may hold it already.
            if uid not in busy:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.pwrite(fd, _CLEAN, 0)
        except BlockingIOError:
            pass
        finally:
            os.close(fd)
    marker.touch(mode=0o600)


def release_sandbox_uid(uid: int) -> None:
    """Kill what may still run as `uid`, then give the uid back. A uid not leased here is ignored."""
    with _UID_LOCK:
        fd = _LEASES.get(uid)
    if fd is None:
        return
    with _UID_LOCK:
        unswept = uid in _UNSWEPT
        _UNSWEPT.discard(uid)
    gone = _sweep(lambda: _pids_of_uid(uid))[1] if unswept else True
    if gone:
        os.pwrite(fd, _CLEAN, 0)
    with _UID_LOCK:
        _LEASES.pop(uid, None)
        os.close(fd)


def is_leased(uid: int) -> bool:
    with _UID_LOCK:
        return uid in _LEASES


def _default_sandbox_user() -> tuple[int, int]:
    name = os.environ.get("EVALSITE_SANDBOX_USER", "nobody")
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except KeyError:
        raise SandboxError(f"EVALSITE_SANDBOX_USER={name!r}: no such user on this worker") from None
    if entry.pw_uid == 0:
        raise SandboxError("EVALSITE_SANDBOX_USER must not be root")
    return entry.pw_uid, entry.pw_gid


def child_identity(cwd: Path, user: int | None) -> tuple[int, int] | None:
    """(uid, gid) the child switches to, or None to keep the worker's (non-root workers)."""
    if os.geteuid() != 0:
        return None
    if user is not None:
        if user == 0:
            raise SandboxError("sandboxed commands never run as root")
        with contextlib.suppress(KeyError):
            return user, pwd.getpwuid(user).pw_gid
        return user, user
    st = os.stat(cwd)
    if st.st_uid != 0:
        return st.st_uid, st.st_gid
    return _default_sandbox_user()


# ---------------------------------------------------------------------------------------------
# pids cgroups

_CGROUP_LOCK = threading.Lock()
_CGROUP_BASE: list[Path | None] = []  # cached probe result: [] = not probed yet
_CGROUP_COUNTER = itertools.count()


def _mounts() -> list[tuple[str, str, set[str]]]:
    with open("/proc/self/mounts") as f:
        rows = [line.split() for line in f]
    return [(row[2], row[1], set(row[3].split(","))) for row in rows if len(row) >= 4]


def _own_cgroup(controller: str | None) -> str | None:
    """This process's cgroup path in the v1 hierarchy of `controller` (None: the v2 one)."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if (controller is None and controllers == "") or (controller in controllers.split(",")):
                return path
    return None


def _probe_cgroup_base(controller: str = "pids") -> Path | None:
    """A folder where this worker may create per-call cgroups of `controller`, or None."""
    for fstype, mountpoint, options in _mounts():
        own = None
        if fstype == "cgroup" and controller in options:
            own = _own_cgroup(controller)
        elif fstype == "cgroup2":
            own = _own_cgroup(None)
        if own is None:
            continue
        parent = Path(mountpoint) / own.lstrip("/")
        base: Path | None = parent / "evalsite"
        try:
            if fstype == "cgroup2":
                base = _prepare_v2_base(parent, parent / "evalsite", controller)
            elif base is not None:
                base.mkdir(exist_ok=True)
        except OSError:
            continue
        if base is not None and os.access(base, os.W_OK):
            _remove_stale_cgroups(base)
            return base
    return None


def _prepare_v2_base(parent: Path, base: Path, controller: str) -> Path | None:
    """cgroup v2: enable `controller` for `base`'s children; fails (None) without delegation."""
    if controller not in (parent / "cgroup.controllers").read_text().split():
        return None
    (parent / "cgroup.subtree_control").write_text(f"+{controller}")
    base.mkdir(exist_ok=True)
    (base / "cgroup.subtree_control").write_text(f"+{controller}")
    return base


_MEMORY_BASE: list[Path | None] = []


def _cgroup_base() -> Path | None:
    if os.environ.get("EVALSITE_SANDBOX_CGROUP", "1") == "0":
        return None
    with _CGROUP_LOCK:
        if not _CGROUP_BASE:
            _CGROUP_BASE.append(_probe_cgroup_base("pids"))
            if _CGROUP_BASE[0] is not None and os.environ.get("EVALSITE_CGROUP_FAVORDYNMODS", "1") != "0":
                favor_dynamic_migrations()
        return _CGROUP_BASE[0]


def favor_dynamic_migrations() -> bool:
    """Remount the cgroup v2 hierarchy with `favordynmods` (Linux >= 6.0); whether it has it.

    Every sandboxed command moves into its own cgroup. Each move takes the kernel's global
    threadgroup lock for writing, which by default waits for an RCU grace period: 6-15 ms on a
    worker host where moves come tens of milliseconds apart, as long as the command itself
    (bwrap, `true`). `favordynmods` keeps that lock ready for writers, at a small cost to every
    fork and exit: the right trade on a host whose work is starting sandboxed commands. The lock
    is one for all hierarchies, so remounting the v2 one helps v1 cgroups too. Needs root in the
    host's mount namespace; where the remount is refused (a container, an older kernel) nothing
    changes but the wait."""
    try:
        mount = _cgroup2_mount()
        if mount is None:
            return False
        target, options = mount
        if "favordynmods" in options:
            return True
        # util-linux's mount keeps the mount's other options (nsdelegate, nosuid...) on remount.
        done = subprocess.run(
            ["mount", "-o", "remount,favordynmods", target], capture_output=True, text=True, check=False
        )
        favored = done.returncode == 0 and "favordynmods" in (_cgroup2_mount() or ("", set()))[1]
        why = done.stderr.strip() or f"exit {done.returncode}"
    except OSError as exc:  # no mount(8), no /proc: the sandbox works all the same
        favored, target, why = False, "cgroup2", str(exc)
    if not favored:
        logger.info(
            "cgroup moves wait for an RCU grace period here (remounting %s with favordynmods: %s)",
            target,
            why,
        )
    return favored


def _cgroup2_mount() -> tuple[str, set[str]] | None:
    """The cgroup v2 mount's path and superblock options, from this process's mountinfo."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields, _, fs = line.rstrip("\n").partition(" - ")
            fstype, _source, options = (fs.split() + ["", "", ""])[:3]
            if fstype == "cgroup2":
                return fields.split()[4], set(options.split(","))
    return None


def _memory_base() -> Path | None:
    """Where per-call memory cgroups go: the pids folder itself on cgroup v2, the v1 memory
    hierarchy otherwise; None where the worker may not create them."""
    if _cgroup_base() is None:
        return None
    with _CGROUP_LOCK:
        if not _MEMORY_BASE:
            _MEMORY_BASE.append(_probe_cgroup_base("memory"))
        return _MEMORY_BASE[0]


def _remove_stale_cgroups(base: Path) -> None:
    """Kill and remove cgroups left by dead workers (their name starts with the worker's pid)."""
    for child in base.iterdir():
        owner = child.name.split("-", 1)[0]
        if child.is_dir() and owner.isdigit() and not _alive(int(owner)):
            Cgroup(child).destroy()


class Cgroup:
    """One call's cgroups: pids (always) and memory (when a cap is asked and the host allows it).

    On cgroup v2 both controllers live in one folder; on v1 each has its own hierarchy.
    """

    def __init__(self, path: Path, memory: Path | None = None) -> None:
        self.path = path
        self.memory = memory

    @property
    def has_memory(self) -> bool:
        return self.memory is not None

    @classmethod
    def create(cls, max_tasks: int | None, memory_bytes: int | None = None) -> Cgroup | None:
        base = _cgroup_base()
        if base is None:
            return None
        name = f"{os.getpid()}-{next(_CGROUP_COUNTER)}-{secrets.token_hex(4)}"
        path = base / name
        path.mkdir()
        cgroup = cls(path)
        try:
            (path / "pids.max").write_text("max" if max_tasks is None else str(max_tasks))
            memory_base = _memory_base() if memory_bytes is not None else None
            if memory_base is not None and memory_bytes is not None:
                cgroup.memory = path if memory_base == base else memory_base / name
                cgroup.memory.mkdir(exist_ok=True)
                _cap_memory(cgroup.memory, memory_bytes)
        except OSError:
            cgroup.destroy()
            raise
        return cgroup

    def open_procs(self) -> list[int]:
        folders = [self.path] + ([self.memory] if self.memory not in (None, self.path) else [])
        return [os.open(folder / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC) for folder in folders]

    def members(self) -> set[int]:
        try:
            text = (self.path / "cgroup.procs").read_text()
        except OSError:
            return set()
        return {pid for pid in map(int, text.split()) if _alive(pid)}

    def memory_exhausted(self) -> bool:
        """Whether the memory cap was hit (the kernel refused memory or killed for it)."""
        if self.memory is None:
            return False
        with contextlib.suppress(OSError, ValueError):
            events = self.memory / "memory.events"
            if events.exists():  # v2
                counts = dict(line.split() for line in events.read_text().splitlines())
                return int(counts.get("oom_kill", 0)) > 0 or int(counts.get("max", 0)) > 0
            if int((self.memory / "memory.failcnt").read_text()) > 0:
                return True
            oom = (self.memory / "memory.oom_control").read_text().splitlines()
            return int(dict(line.split() for line in oom).get("oom_kill", 0)) > 0
        return False

    def destroy(self) -> tuple[int, bool]:
        """Kill every member, then remove the folders: (processes killed, whether none is left)."""
        kill_file = self.path / "cgroup.kill"  # cgroup v2 >= 5.14: atomic, beats fork races
        if kill_file.exists():
            with contextlib.suppress(OSError):
                kill_file.write_text("1")
        killed, gone = _sweep(self.members)
        for folder in [self.path] + ([self.memory] if self.memory not in (None, self.path) else []):
            _remove_cgroup_folder(folder)
        return killed, gone


def _cap_memory(folder: Path, memory_bytes: int) -> None:
    if (folder / "memory.max").exists():  # v2
        (folder / "memory.max").write_text(str(memory_bytes))
        with contextlib.suppress(OSError):
            (folder / "memory.swap.max").write_text("0")
        return
    (folder / "memory.limit_in_bytes").write_text(str(memory_bytes))
    with contextlib.suppress(OSError):  # no swap accounting on some kernels
        (folder / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))


def _remove_cgroup_folder(folder: Path) -> None:
    for _ in range(1000):  # a member killed a moment ago may still be leaving the cgroup
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
            time.sleep(0.001)


# ---------------------------------------------------------------------------------------------
# The processes of one call


class Containment:
    """Everything needed to find and kill the processes one call started."""

    def __init__(
        self, cgroup: Cgroup | None, exclusive_uid: int | None, token: str, leased_uid: int | None = None
    ) -> None:
        self.cgroup = cgroup
        self.exclusive_uid = exclusive_uid
        self.leased_uid = leased_uid  # the trial's own uid, when the command runs as one
        self.token = token.encode()
        self.leader: int | None = None

    def members(self) -> set[int]:
        if self.cgroup is not None:
            return self.cgroup.members()
        if self.exclusive_uid is not None:
            return _pids_of_uid(self.exclusive_uid)
        return _tree_members(self.leader, self.token) if self.leader else set()

    def signal_group(self, signum: int) -> None:
        if self.leader is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.leader, signum)

    def terminate(self) -> None:
        """SIGTERM to the command's processes but not to bwrap's own: a signalled bwrap dies at
        once and takes its namespace down with SIGKILL, leaving the agent no time to finish."""
        inside = [pid for pid in self.members() if _comm(pid) != "bwrap"]
        if not inside:
            self.signal_group(signal.SIGTERM)
        for pid in inside:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)

    def kill_all(self) -> int:
        killed = _kill_until_gone(self.members)  # list first, so the count is right
        self.signal_group(signal.SIGKILL)  # and the group too, in case a search missed one
        return killed

    def memory_exhausted(self) -> bool:
        return self.cgroup is not None and self.cgroup.memory_exhausted()

    def close(self) -> int:
        """Kill what the call left in its cgroup. A leased uid whose command ran without one, or
        whose cgroup could not be emptied, is swept by uid when released (see `_UNSWEPT`)."""
        killed, gone = self.cgroup.destroy() if self.cgroup is not None else (0, False)
        if not gone and self.leased_uid is not None:
            with _UID_LOCK:
                _UNSWEPT.add(self.leased_uid)
        return killed
