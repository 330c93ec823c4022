"""Process control for every command a sandbox runs, whatever its driver.

`run` starts one command line (a driver's: bwrap, a container engine's exec) through the
launcher (`launcher/evalsite-launch.c`: it joins the command's cgroups, takes the sandbox
identity, sets the resource limits, then execs) in its own session and process group, with
capped output, live stdout lines, a wall-clock timeout and a cooperative stop, and makes sure
that nothing it started is still running when it returns.

How it finds what a command left running (a pids cgroup, a leased sandbox uid, or the session
and an environment token), and which uid a command runs as on a root worker, is `containment`.

Pure Python, Linux only, no Django.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import resource
import secrets as secrets_module
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from runs_app.engine import native
from runs_app.engine.sandbox.base import Limits, ProcessResult, SandboxError
from runs_app.engine.sandbox.containment import Cgroup, Containment, is_leased, tasks_of_uid

SANDBOX_ID_VAR = "EVALSITE_SANDBOX_ID"
_READ_CHUNK = 1 << 16


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
        if self.on_line is None:
            return
        try:
            self.on_line(line)
        except BaseException as exc:  # re-raised by run_process once the process is dead
            self.error = exc
            self.on_line = None

    def text(self) -> str:
        return self.kept.decode("utf-8", "replace")


def _rlimits(limits: Limits, nproc: int | None, memory_fallback: bool) -> list[tuple[int, int, int]]:
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
    if memory_fallback and limits.memory_bytes is not None:
        # Without a memory cgroup: writable private memory of each process (not the tree).
        caps.append((resource.RLIMIT_DATA, limits.memory_bytes, limits.memory_bytes))
    return caps


def _nproc_limit(limits: Limits, identity: tuple[int, int] | None) -> int | None:
    """RLIMIT_NPROC counts every thread of the *user*, zombies included, not of the tree.

    So the cap is set above what the uid holds already: zombies of a previous command not yet
    reaped by init (a leased uid holds nothing else), or the other processes of a shared uid.
    """
    if limits.max_processes is None:
        return None
    uid = identity[0] if identity else os.getuid()
    return tasks_of_uid(uid) + limits.max_processes


def _launch_options(
    identity: tuple[int, int] | None, caps: list[tuple[int, int, int]], cgroup_fds: list[int]
) -> list[str]:
    """The launcher's options for what the child does before exec: join the cgroups (while still
    root), take the sandbox identity, die with the worker, set the limits."""
    options = [arg for fd in cgroup_fds for arg in ("-c", str(fd))]
    if identity is not None:
        options += ["-g", str(identity[1]), "-u", str(identity[0])]
    for which, soft, hard in caps:
        values = (str(v) if v != resource.RLIM_INFINITY else "inf" for v in (which, soft, hard))
        options += ["-r", ":".join(values)]
    return options


_LAUNCHER_SOURCE = Path(__file__).with_name("launcher") / "evalsite-launch.c"
LAUNCHER = Path(
    os.environ.get("EVALSITE_LAUNCHER") or Path(__file__).resolve().parents[3] / ".build" / "evalsite-launch"
)
_LAUNCHER_LOCK = threading.Lock()
_LAUNCHER_CHECKED: list[bool] = []


def launcher() -> Path:
    """The sandbox launcher (`launcher/evalsite-launch.c`), built with the system's C compiler
    when missing or older than its source (`make sandbox` builds it too)."""
    if _LAUNCHER_CHECKED:
        return LAUNCHER  # checked once per process: this runs before every command
    with _LAUNCHER_LOCK:
        if not LAUNCHER.exists() or (
            _LAUNCHER_SOURCE.exists() and LAUNCHER.stat().st_mtime < _LAUNCHER_SOURCE.stat().st_mtime
        ):
            try:
                native.compile_c(_LAUNCHER_SOURCE, LAUNCHER, "`make sandbox`")
            except native.BuildError as exc:
                raise SandboxError(str(exc)) from None
        _LAUNCHER_CHECKED.append(True)
        return LAUNCHER


def run(
    args: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    limits: Limits,
    identity: tuple[int, int] | None,
    stdin: bytes | None = None,
    on_stdout_line: Callable[[str], None] | None = None,
    should_stop: Callable[[], str | None] | None = None,
    poll_interval: float = 0.25,
    use_cgroup: bool | None = None,
    max_line_bytes: int = 8 << 20,
) -> ProcessResult:
    """Run one command line (a driver's) under the sandbox's control and return how it ended.

    stdin is /dev/null unless bytes are given (some CLIs wait forever on an open stdin). Every
    stdout line (cut at `max_line_bytes`) goes to `on_stdout_line` as it arrives, even past the
    stored cap; the callback runs on this thread. `should_stop` is polled every `poll_interval`
    seconds and after each read of stdout (so what `on_stdout_line` saw is acted on at once); a
    non-None reason stops the command like the wall timeout does: SIGTERM to its group, SIGKILL
    after `limits.kill_grace_seconds`. When the main process has ended, everything it left
    running is killed.

    `identity` (uid, gid) is what the child switches to (root workers; `containment.child_identity`).
    `use_cgroup` False skips the cgroups, True requires one. An exception raised by
    `on_stdout_line` or `should_stop` stops the command and is re-raised once everything is dead.
    """
    leased = identity[0] if identity is not None and is_leased(identity[0]) else None
    cgroup = None
    if use_cgroup is not False:
        cgroup = Cgroup.create(limits.max_processes, limits.memory_bytes)
        if cgroup is None and use_cgroup:
            raise SandboxError("use_cgroup=True but this worker cannot create a pids cgroup")
    token = secrets_module.token_hex(8)
    containment = Containment(cgroup, leased if cgroup is None else None, token, leased)
    cgroup_fds: list[int] = []
    try:
        cgroup_fds = cgroup.open_procs() if cgroup is not None else []
        memory_fallback = cgroup is None or not cgroup.has_memory
        # A pids cgroup caps the tree exactly; RLIMIT_NPROC (a /proc scan per call) only without one.
        nproc = _nproc_limit(limits, identity) if cgroup is None else None
        caps = _rlimits(limits, nproc, memory_fallback)
        # No preexec_fn: the launcher does that setup, so Python starts the child with vfork.
        argv_launched = [str(launcher()), *_launch_options(identity, caps, cgroup_fds), "--", *args]
        started = time.monotonic()
        proc = subprocess.Popen(
            argv_launched,
            cwd=cwd,
            env={**env, SANDBOX_ID_VAR: token},
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            pass_fds=cgroup_fds,
        )
    except BaseException:
        containment.close()
        raise
    finally:
        for fd in cgroup_fds:
            os.close(fd)
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
        containment: Containment,
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
        self.memory_exhausted = False

    def run(self) -> None:
        assert self.proc.stdout is not None and self.proc.stderr is not None  # run() opens both pipes
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
        self.containment.terminate()

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
                    if key.data is self.out:  # what the lines told the callback is acted on now
                        self.next_poll = 0.0
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
            if self.proc.stdin is not None:
                self.proc.stdin.close()

    def shutdown(self) -> None:
        """Whatever happened (including an exception in the loop), leave nothing running."""
        if self.proc.poll() is None:
            self.killed = True
            self.containment.kill_all()
            self.proc.wait()
        if not self.swept:
            self.leftovers += self.containment.kill_all()
        self.memory_exhausted = self.containment.memory_exhausted()
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
        if 128 < code < 128 + signal.NSIG:
            code = 128 - code  # bwrap exits 128 + N when a signal N ended the command, as shells do
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
            memory_exhausted=self.memory_exhausted,
        )


def _grow_pipe(fd: int) -> None:
    """Larger pipe buffers mean fewer wake-ups when a process writes a lot."""
    with contextlib.suppress(OSError, AttributeError):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)
