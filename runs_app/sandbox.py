"""Process control for every command an agent, a criterion or a setup step runs.

`run_process` starts one command in its own session and process group, with resource limits,
capped output, live stdout lines, a wall-clock timeout and a cooperative stop, and makes sure
that nothing it started is still running when it returns.

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

Pure Python, Linux only, no Django.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import itertools
import os
import pwd
import resource
import secrets as secrets_module
import selectors
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

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
SANDBOX_ID_VAR = "EVALSITE_SANDBOX_ID"
_READ_CHUNK = 1 << 16
_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)


class SandboxError(RuntimeError):
    """The sandbox could not be set up (no free uid, unwritable cgroup, missing secret...)."""


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


def _tasks_of_uid(uid: int) -> int:
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
    """SIGKILL whatever `find` returns until it returns nothing; the number of processes killed.

    Repeats because a process may fork between the listing and the kill; the process cap keeps
    the number of rounds small.
    """
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    pause = 0.002
    while True:
        pids = find() - {os.getpid()}
        if not pids or time.monotonic() > deadline:
            return len(killed)
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


def _uid_range() -> range:
    """`EVALSITE_SANDBOX_UIDS` as "first-last" (default 64000-64255: no system account there)."""
    spec = os.environ.get("EVALSITE_SANDBOX_UIDS", "64000-64255")
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
    while _tasks_of_uid(uid) and time.monotonic() < deadline:
        time.sleep(0.01)
    return uid


def release_sandbox_uid(uid: int) -> None:
    """Kill what still runs as `uid`, then give the uid back. A uid not leased here is ignored."""
    with _UID_LOCK:
        fd = _LEASES.get(uid)
    if fd is None:
        return
    kill_uid_processes(uid)
    if not _pids_of_uid(uid):
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


def _identity(cwd: Path, user: int | None) -> tuple[int, int] | None:
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


def _probe_cgroup_base() -> Path | None:
    """A folder where this worker may create per-call pids cgroups, or None."""
    for fstype, mountpoint, options in _mounts():
        own = None
        if fstype == "cgroup" and "pids" in options:
            own = _own_cgroup("pids")
        elif fstype == "cgroup2":
            own = _own_cgroup(None)
        if own is None:
            continue
        parent = Path(mountpoint) / own.lstrip("/")
        base = parent / "evalsite"
        try:
            if fstype == "cgroup2":
                base = _prepare_v2_base(parent, base)
            else:
                base.mkdir(exist_ok=True)
        except OSError:
            continue
        if base is not None and os.access(base, os.W_OK):
            _remove_stale_cgroups(base)
            return base
    return None


def _prepare_v2_base(parent: Path, base: Path) -> Path | None:
    """cgroup v2: enable `pids` for `base`'s children; fails (None) without delegation."""
    if "pids" not in (parent / "cgroup.controllers").read_text().split():
        return None
    (parent / "cgroup.subtree_control").write_text("+pids")
    base.mkdir(exist_ok=True)
    (base / "cgroup.subtree_control").write_text("+pids")
    return base


def _cgroup_base() -> Path | None:
    if os.environ.get("EVALSITE_SANDBOX_CGROUP", "1") == "0":
        return None
    with _CGROUP_LOCK:
        if not _CGROUP_BASE:
            _CGROUP_BASE.append(_probe_cgroup_base())
        return _CGROUP_BASE[0]


def _remove_stale_cgroups(base: Path) -> None:
    """Kill and remove cgroups left by dead workers (their name starts with the worker's pid)."""
    for child in base.iterdir():
        owner = child.name.split("-", 1)[0]
        if child.is_dir() and owner.isdigit() and not _alive(int(owner)):
            _Cgroup(child).destroy()


class _Cgroup:
    """One per-call pids cgroup."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, max_tasks: int | None) -> _Cgroup | None:
        base = _cgroup_base()
        if base is None:
            return None
        path = base / f"{os.getpid()}-{next(_CGROUP_COUNTER)}-{secrets_module.token_hex(4)}"
        path.mkdir()
        cgroup = cls(path)
        try:
            (path / "pids.max").write_text("max" if max_tasks is None else str(max_tasks))
        except OSError:
            cgroup.destroy()
            raise
        return cgroup

    def open_procs(self) -> int:
        return os.open(self.path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)

    def members(self) -> set[int]:
        try:
            text = (self.path / "cgroup.procs").read_text()
        except OSError:
            return set()
        return {pid for pid in map(int, text.split()) if _alive(pid)}

    def destroy(self) -> int:
        """Kill every member, then remove the folder; the number of processes killed."""
        kill_file = self.path / "cgroup.kill"  # cgroup v2 >= 5.14: atomic, beats fork races
        if kill_file.exists():
            with contextlib.suppress(OSError):
                kill_file.write_text("1")
        killed = _kill_until_gone(self.members)
        for _ in range(100):  # a member killed a moment ago may still be leaving the cgroup
            try:
                self.path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
                time.sleep(0.01)
        return killed


# ---------------------------------------------------------------------------------------------
# Running one process


class _Capture:
    """Keeps the first `cap` bytes of a stream, counts the rest, and splits lines for a callback.

    Memory stays bounded by `cap` plus one line of at most `max_line` bytes (longer lines are cut)
    however much the process writes.
    """

    def __init__(self, cap: int, on_line: Callable[[str], None] | None, max_line: int) -> None:
        self.kept = bytearray()
        self.total = 0
        self.cap = cap
        self.on_line = on_line
        self.max_line = max_line
        self.partial = bytearray()
        self.error: BaseException | None = None

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.cap - len(self.kept)
        if room > 0:
            self.kept += data[:room]
        if self.on_line is not None:
            *complete, rest = data.split(b"\n")
            for piece in complete:
                self._append(piece)
                self._emit()
            self._append(rest)

    def finish(self) -> None:
        if self.on_line is not None and self.partial:
            self._emit()

    def _append(self, piece: bytes) -> None:
        room = self.max_line - len(self.partial)
        if room > 0:
            self.partial += piece[:room]

    def _emit(self) -> None:
        line = self.partial.decode("utf-8", "replace")
        self.partial.clear()
        try:
            self.on_line(line)
        except BaseException as exc:  # re-raised by run_process once the process is dead
            self.error = exc
            self.on_line = None

    def text(self) -> str:
        return self.kept.decode("utf-8", "replace")


def _rlimits(limits: Limits, nproc: int | None) -> list[tuple[int, int, int]]:
    caps = [(resource.RLIMIT_CORE, 0, 0)]
    if limits.cpu_seconds is not None:
        # SIGXCPU at the soft limit lets the process report; SIGKILL one second later.
        caps.append((resource.RLIMIT_CPU, limits.cpu_seconds, limits.cpu_seconds + 1))
    if limits.address_space_bytes is not None:
        caps.append((resource.RLIMIT_AS, limits.address_space_bytes, limits.address_space_bytes))
    if nproc is not None:
        caps.append((resource.RLIMIT_NPROC, nproc, nproc))
    if limits.max_file_bytes is not None:
        caps.append((resource.RLIMIT_FSIZE, limits.max_file_bytes, limits.max_file_bytes))
    return caps


def _nproc_limit(limits: Limits, identity: tuple[int, int] | None) -> int | None:
    """RLIMIT_NPROC counts every thread of the *user*, zombies included, not of the tree.

    So the cap is set above what the uid holds already: zombies of a previous command not yet
    reaped by init (a leased uid holds nothing else), or the other processes of a shared uid.
    """
    if limits.max_processes is None:
        return None
    uid = identity[0] if identity else os.getuid()
    return _tasks_of_uid(uid) + limits.max_processes


def _make_preexec(
    identity: tuple[int, int] | None, caps: list[tuple[int, int, int]], cgroup_fd: int | None
) -> Callable[[], None]:
    """Runs in the child between fork and exec: no imports, no locks, only system calls."""
    setrlimit, prctl = resource.setrlimit, _LIBC.prctl

    def preexec() -> None:
        if cgroup_fd is not None:
            os.write(cgroup_fd, b"0")  # "0" = the writing process; must happen while still root
        if identity is not None:
            os.setgroups([])
            os.setresgid(identity[1], identity[1], identity[1])
            os.setresuid(identity[0], identity[0], identity[0])
        # If the worker dies (SIGKILL), the kernel kills the command instead of orphaning it.
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        for which, soft, hard in caps:
            setrlimit(which, (soft, hard))

    return preexec


class _Containment:
    """Everything needed to find and kill the processes one call started."""

    def __init__(self, cgroup: _Cgroup | None, exclusive_uid: int | None, token: str) -> None:
        self.cgroup = cgroup
        self.exclusive_uid = exclusive_uid
        self.token = token.encode()
        self.leader: int | None = None

    def members(self) -> set[int]:
        if self.cgroup is not None:
            return self.cgroup.members()
        if self.exclusive_uid is not None:
            return _pids_of_uid(self.exclusive_uid)
        return _tree_members(self.leader, self.token) if self.leader else set()

    def signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.leader, signum)

    def kill_all(self) -> int:
        killed = _kill_until_gone(self.members)  # list first, so the count is right
        self.signal_group(signal.SIGKILL)  # and the group too, in case a search missed one
        return killed

    def close(self) -> int:
        return self.cgroup.destroy() if self.cgroup is not None else 0


def run_process(
    argv: list[str] | str,
    *,
    cwd: Path,
    env: dict[str, str],
    limits: Limits,
    stdin: bytes | None = None,
    on_stdout_line: Callable[[str], None] | None = None,
    should_stop: Callable[[], str | None] | None = None,
    poll_interval: float = 0.25,
    user: int | None = None,
    use_cgroup: bool | None = None,
    max_line_bytes: int = 8 << 20,
) -> ProcessResult:
    """Run one command under the sandbox's control and return how it ended.

    A str `argv` runs through `/bin/sh -c`. stdin is /dev/null unless bytes are given (some CLIs
    wait forever on an open stdin). Every stdout line (cut at `max_line_bytes`) goes to
    `on_stdout_line` as it arrives, even past the stored cap; the callback runs on this thread.
    `should_stop` is polled every `poll_interval` seconds; a non-None reason stops the command
    like the wall timeout does: SIGTERM to its group, SIGKILL after `limits.kill_grace_seconds`.
    When the main process has ended, everything it left running is killed.

    `user` forces the sandbox uid (root workers); `use_cgroup` False skips the pids cgroup,
    True requires one. An exception raised by `on_stdout_line` or `should_stop` stops the command
    and is re-raised once everything is dead.
    """
    args = ["/bin/sh", "-c", argv] if isinstance(argv, str) else list(argv)
    identity = _identity(cwd, user)
    exclusive = identity is not None and is_leased(identity[0])
    cgroup = None
    if use_cgroup is not False:
        cgroup = _Cgroup.create(limits.max_processes)
        if cgroup is None and use_cgroup:
            raise SandboxError("use_cgroup=True but this worker cannot create a pids cgroup")
    token = secrets_module.token_hex(8)
    containment = _Containment(cgroup, identity[0] if exclusive and cgroup is None else None, token)
    cgroup_fd = None
    try:
        cgroup_fd = cgroup.open_procs() if cgroup is not None else None
        preexec = _make_preexec(identity, _rlimits(limits, _nproc_limit(limits, identity)), cgroup_fd)
        started = time.monotonic()
        proc = subprocess.Popen(
            args,
            cwd=cwd,
            env={**env, SANDBOX_ID_VAR: token},
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=preexec,
        )
    except BaseException:
        containment.close()
        raise
    finally:
        if cgroup_fd is not None:
            os.close(cgroup_fd)
    containment.leader = proc.pid
    supervisor = _Supervisor(
        proc, containment, limits, stdin, on_stdout_line, should_stop, poll_interval, max_line_bytes
    )
    try:
        supervisor.run()
    finally:
        supervisor.shutdown()
    duration = time.monotonic() - started
    for error in (supervisor.stop_error, supervisor.out.error):
        if error is not None:
            raise error
    return supervisor.result(duration)


class _Supervisor:
    """The event loop of one `run_process` call: pipes, exit, deadline, stop requests."""

    def __init__(
        self,
        proc: subprocess.Popen,
        containment: _Containment,
        limits: Limits,
        stdin: bytes | None,
        on_stdout_line: Callable[[str], None] | None,
        should_stop: Callable[[], str | None] | None,
        poll_interval: float,
        max_line: int,
    ) -> None:
        self.proc = proc
        self.containment = containment
        self.limits = limits
        self.should_stop = should_stop
        self.poll_interval = poll_interval
        self.out = _Capture(limits.stdout_cap_bytes, on_stdout_line, max_line)
        self.err = _Capture(limits.stderr_cap_bytes, None, max_line)
        self.pending_stdin = memoryview(stdin or b"")
        self.deadline = time.monotonic() + limits.wall_seconds
        self.next_poll = time.monotonic() + poll_interval
        self.term_sent_at: float | None = None
        self.timed_out = False
        self.killed = False
        self.stop_reason: str | None = None
        self.stop_error: BaseException | None = None
        self.leftovers = 0
        self.swept = False
        self.selector = selectors.DefaultSelector()
        self.pidfd: int | None = None

    def run(self) -> None:
        for stream, capture in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            _grow_pipe(stream.fileno())
            self.selector.register(stream.fileno(), selectors.EVENT_READ, capture)
        if self.proc.stdin is not None:
            os.set_blocking(self.proc.stdin.fileno(), False)
            self.selector.register(self.proc.stdin.fileno(), selectors.EVENT_WRITE, "stdin")
        with contextlib.suppress(OSError, AttributeError):
            self.pidfd = os.pidfd_open(self.proc.pid)  # wakes the loop the moment the child exits
            self.selector.register(self.pidfd, selectors.EVENT_READ, "exit")
        drain_deadline = None
        while True:
            now = time.monotonic()
            if self.proc.poll() is None:
                self._enforce(now)
            elif drain_deadline is None:
                # The main process is gone: kill what it left so the pipes reach end of file.
                self.leftovers = self.containment.kill_all()
                self.swept = True
                drain_deadline = now + 2.0
            if drain_deadline is not None and (not self._has_pipes() or now > drain_deadline):
                return
            self._pump(self._wait_time(now, drain_deadline))

    def _enforce(self, now: float) -> None:
        if self.term_sent_at is not None:
            if now >= self.term_sent_at + self.limits.kill_grace_seconds and not self.killed:
                self.killed = True
                self.containment.kill_all()
            return
        if now >= self.deadline:
            self.timed_out = True
            self._terminate(now)
        elif self.out.error is not None:
            self.stop_reason = "callback error"
            self._terminate(now)
        elif self.should_stop is not None and now >= self.next_poll:
            self.next_poll = now + self.poll_interval
            try:
                reason = self.should_stop()
            except BaseException as exc:
                self.stop_error, reason = exc, "should_stop error"
            if reason is not None:
                self.stop_reason = reason
                self._terminate(now)

    def _terminate(self, now: float) -> None:
        self.term_sent_at = now
        self.containment.signal_group(signal.SIGTERM)

    def _wait_time(self, now: float, drain_deadline: float | None) -> float:
        # Only moments still ahead: a passed deadline would turn the loop into a busy spin.
        moments = [now + self.poll_interval]
        if self.term_sent_at is None:
            moments.append(self.deadline)
            if self.should_stop is not None:
                moments.append(self.next_poll)
        elif not self.killed:
            moments.append(self.term_sent_at + self.limits.kill_grace_seconds)
        if drain_deadline is not None:
            moments.append(drain_deadline)
        return max(0.0, min(moments) - now)

    def _has_pipes(self) -> bool:
        return any(key.data not in ("exit", "stdin") for key in self.selector.get_map().values())

    def _pump(self, timeout: float) -> None:
        for key, _ in self.selector.select(timeout):
            if key.data == "exit":
                self.selector.unregister(key.fd)
            elif key.data == "stdin":
                self._write_stdin(key.fd)
            else:
                data = os.read(key.fd, _READ_CHUNK)
                if data:
                    key.data.feed(data)
                else:
                    self.selector.unregister(key.fd)

    def _write_stdin(self, fd: int) -> None:
        try:
            written = os.write(fd, self.pending_stdin[:_READ_CHUNK])
            self.pending_stdin = self.pending_stdin[written:]
        except BlockingIOError:
            return
        except BrokenPipeError:
            self.pending_stdin = self.pending_stdin[:0]
        if not self.pending_stdin:
            self.selector.unregister(fd)
            self.proc.stdin.close()

    def shutdown(self) -> None:
        """Whatever happened (including an exception in the loop), leave nothing running."""
        if self.proc.poll() is None:
            self.killed = True
            self.containment.kill_all()
            self.proc.wait()
        if not self.swept:
            self.leftovers += self.containment.kill_all()
        self.leftovers += self.containment.close()
        self.selector.close()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
        self.out.finish()

    def result(self, duration: float) -> ProcessResult:
        code = self.proc.returncode
        return ProcessResult(
            exit_code=code if code >= 0 else None,
            signal=-code if code < 0 else None,
            stdout=self.out.text(),
            stderr=self.err.text(),
            stdout_truncated=self.out.total > self.out.cap,
            stderr_truncated=self.err.total > self.err.cap,
            timed_out=self.timed_out,
            cancelled=self.stop_reason is not None and not self.timed_out,
            killed=self.killed,
            duration_seconds=duration,
            stop_reason=self.stop_reason,
            stdout_total_bytes=self.out.total,
            stderr_total_bytes=self.err.total,
            leftovers_killed=self.leftovers,
        )


def _grow_pipe(fd: int) -> None:
    """Larger pipe buffers mean fewer wake-ups when a process writes a lot."""
    with contextlib.suppress(OSError, AttributeError):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)
