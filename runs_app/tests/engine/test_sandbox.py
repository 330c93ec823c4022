"""Process control under hostile commands: every test bounds its processes in time and count.

On a root worker (CI) commands run as a leased sandbox uid; the `mode` parameter exercises each
containment: a pids cgroup, the leased uid alone, and the session/environment search.
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from runs_app.engine import sandbox
from runs_app.engine.sandbox import (
    DEFAULT_ENV_ALLOWLIST,
    Limits,
    Mount,
    build_env,
    containment,
    process,
    redact,
)
from runs_app.engine.sandbox.bubblewrap import run_process
from runs_app.engine.sandbox.workspace import cleanup, layout
from runs_app.tests.engine.nobody import NOBODY, nobody_worker

HOSTILE = Path(__file__).parents[1] / "hostile"
# The sandbox uid cannot run a Python that lives under /root (pyenv): prefer the system one.
PY = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
IS_ROOT = os.geteuid() == 0


@pytest.fixture
def base():
    folder = Path(tempfile.mkdtemp(prefix="evalsite-sandbox-test-"))
    os.chmod(folder, 0o711)  # the sandbox uid must be able to reach the trial folders
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def trial(base):
    paths = layout(base / "trial")
    yield paths
    cleanup(paths.root)


@pytest.fixture(params=["cgroup", "uid", "tree"])
def mode(request, trial, base):
    """(cwd, run_process keyword arguments, mode name) for one containment mode."""
    if request.param == "cgroup":
        if containment._cgroup_base() is None:
            pytest.skip("this host offers no writable pids cgroup")
        return trial.workspace, {"use_cgroup": True}, "cgroup"
    if request.param == "uid":
        if not IS_ROOT:
            pytest.skip("only a root worker runs commands as a leased uid")
        return trial.workspace, {"use_cgroup": False}, "uid"
    if not IS_ROOT:
        return trial.workspace, {"use_cgroup": False}, "tree"
    shared = base / "shared"  # a uid not leased to the trial: only the session/environment search
    shared.mkdir(mode=0o700)
    os.chown(shared, NOBODY, NOBODY)
    # nobody cannot reach the trial's own HOME and /tmp: an empty /tmp, no HOME.
    return shared, {"use_cgroup": False, "user": NOBODY, "mounts": [], "tmp": None}, "tree"


def slack(name: str) -> int:
    """RLIMIT_NPROC on a uid shared with other commands is only approximately per command."""
    return 10 if name == "tree" else 0


def put(folder: Path, name: str) -> str:
    dest = folder / name
    shutil.copy(HOSTILE / name, dest)
    owner = folder.stat()
    os.chown(dest, owner.st_uid, owner.st_gid)
    return str(dest)


def env_for(paths, **secrets) -> dict[str, str]:
    return build_env(
        home=paths.home, tmpdir=paths.tmp, allowlist=DEFAULT_ENV_ALLOWLIST, secrets=secrets, extra={}
    )


def box(paths) -> dict:
    """The trial's HOME (writable) and /tmp, as the runner mounts them."""
    return {"mounts": [Mount(paths.home, writable=True)], "tmp": paths.tmp}


def quick(**overrides) -> Limits:
    return Limits(**{"wall_seconds": 10, "kill_grace_seconds": 0.5, **overrides})


def dead(pid: int) -> bool:
    return not containment._alive(pid)


def processes_inside(folder: Path) -> list[int]:
    """Live processes whose working directory is `folder`: none may outlive their command."""
    found = []
    for name in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if name.isdigit() and Path(os.readlink(f"/proc/{name}/cwd")) == folder and not dead(int(name)):
                found.append(int(name))
    return found


def read_pids(path: Path) -> list[int]:
    return [int(word) for word in path.read_text().split()]


def test_it_runs_a_command_and_reports_its_exit(trial):
    result = run_process(
        "echo out; echo err >&2; exit 3",
        cwd=trial.workspace,
        env=env_for(trial),
        **box(trial),
        limits=quick(),
    )

    assert (result.exit_code, result.signal) == (3, None)
    assert (result.stdout, result.stderr) == ("out\n", "err\n")
    assert not (result.timed_out or result.cancelled or result.killed or result.stdout_truncated)


@pytest.mark.skipif(not IS_ROOT, reason="only a root worker switches to a sandbox uid")
def test_it_never_runs_commands_as_root(trial, base):
    own = run_process(["id", "-u"], cwd=trial.workspace, env=env_for(trial), **box(trial), limits=quick())
    fallback = run_process(["id", "-u"], cwd=base, env=env_for(trial), limits=quick())

    assert int(own.stdout) == trial.uid
    assert int(fallback.stdout) == NOBODY  # a root-owned folder: EVALSITE_SANDBOX_USER's default


def test_it_times_out_an_infinite_loop(trial):
    result = run_process(
        "while :; do :; done",
        cwd=trial.workspace,
        env=env_for(trial),
        **box(trial),
        limits=quick(wall_seconds=1),
    )

    assert result.timed_out and not result.cancelled
    assert result.signal == signal.SIGTERM
    assert 1 <= result.duration_seconds < 1 + 0.5 + 0.5


def test_it_caps_a_gigabyte_of_stdout_and_memory_stays_flat(trial):
    gigabyte = 1 << 30
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak RSS mark to the current RSS
    before = int(_status("VmRSS"))

    result = run_process(
        f"yes | head -c {gigabyte}",
        cwd=trial.workspace,
        env=env_for(trial),
        **box(trial),
        limits=quick(wall_seconds=60, stdout_cap_bytes=100_000),
    )

    growth_mb = (int(_status("VmHWM")) - before) / 1024
    assert result.exit_code == 0 and not result.timed_out
    assert result.stdout_total_bytes == gigabyte
    assert result.stdout_truncated and len(result.stdout) == 100_000
    assert result.stdout.startswith("y\ny\n")
    assert growth_mb < 8, f"peak RSS grew by {growth_mb:.1f} MB while reading 1 GB"


def _status(field: str) -> str:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return line.split()[1]
    raise AssertionError(f"{field} missing from /proc/self/status")


def test_it_caps_processes_with_a_bounded_spawner(mode, trial):
    cwd, options, name = mode
    script = put(cwd, "spawner.py")

    result = run_process(
        [PY, script, "3000"],
        cwd=cwd,
        env=env_for(trial),
        limits=quick(max_processes=40),
        **{**box(trial), **options},
    )

    report = json.loads(result.stdout)
    assert 20 <= report["started"] < 40 + slack(name), report["started"]  # the spawner takes one
    assert processes_inside(cwd) == []


def test_it_contains_a_depth_guarded_fork_bomb(mode, trial):
    # Even with no limit at all this bomb stops at 256 shells.
    cwd, options, name = mode
    script = put(cwd, "bomb.sh")
    seen: list[int] = []

    def sample() -> None:  # counts the processes alive inside the sandbox, every 50 ms
        seen.append(len(processes_inside(cwd)))

    result = run_process(
        ["/bin/sh", script, "8"],
        cwd=cwd,
        env=env_for(trial),
        limits=quick(wall_seconds=2, max_processes=30),
        should_stop=sample,
        poll_interval=0.05,
        **{**box(trial), **options},
    )

    assert "fork" in result.stderr.lower()  # the shells were refused new processes
    # Zombies of refused shells hold slots too, so fewer than 30 may be alive at once.
    assert 10 <= max(seen) <= 30 + slack(name), seen
    assert result.duration_seconds < 2 + 0.5 + 1
    assert processes_inside(cwd) == []


def test_it_kills_a_process_that_ignores_sigterm(trial):
    script = put(trial.workspace, "ignore_term.py")
    lines: list[str] = []

    result = run_process(
        [PY, script],
        cwd=trial.workspace,
        env=env_for(trial),
        **box(trial),
        limits=quick(kill_grace_seconds=0.5),
        on_stdout_line=lines.append,
        should_stop=lambda: "cancelled" if "ready" in lines else None,
        poll_interval=0.05,
    )

    assert result.killed and result.cancelled and result.stop_reason == "cancelled"
    assert result.signal == signal.SIGKILL
    assert "got SIGTERM, ignoring it" in lines
    assert result.duration_seconds < 3


def test_what_a_line_tells_the_callback_stops_the_process_at_once_not_at_the_next_poll(trial):
    lines: list[str] = []
    started = time.monotonic()

    result = run_process(
        "echo decided; sleep 20",
        cwd=trial.workspace,
        env=env_for(trial),
        **box(trial),
        limits=quick(kill_grace_seconds=0.5),
        on_stdout_line=lines.append,
        should_stop=lambda: "budget" if "decided" in lines else None,
        poll_interval=30.0,
    )

    assert result.stop_reason == "budget" and lines == ["decided"]
    assert time.monotonic() - started < 5  # not 20 s of sleep, nor a 30 s poll


def test_it_keeps_writes_to_home_inside_the_sandbox(trial):
    result = run_process(
        'echo note > "$HOME/written.txt"; mkdir -p ~/.config/tool; echo x > ~/.config/tool/rc; '
        'echo "$TMPDIR"',
        cwd=trial.workspace,
        env=env_for(trial),
        **box(trial),
        limits=quick(),
    )

    assert result.exit_code == 0, result.stderr
    assert (trial.home / "written.txt").read_text() == "note\n"
    assert (trial.home / ".config/tool/rc").exists()
    assert result.stdout.strip() == "/tmp"  # the trial's own tmp folder, mounted there


def test_it_kills_children_that_daemonize(mode, trial):
    cwd, options, name = mode
    script = put(cwd, "daemonize.sh")

    result = run_process(
        ["/bin/sh", script], cwd=cwd, env=env_for(trial), limits=quick(), **{**box(trial), **options}
    )

    assert result.stdout == "started\n"
    # Both daemons (one left the session, one also cleared its environment) died with the
    # sandbox's PID namespace, whatever the containment mode.
    assert (cwd / "daemon.pid").exists() and (cwd / "scrubbed.pid").exists()
    assert processes_inside(cwd) == []


def test_it_stops_the_whole_group_within_two_seconds_when_cancelled(trial):
    asked_at: list[float] = []

    def should_stop() -> str | None:
        if (trial.workspace / "pids").exists() and len(read_pids(trial.workspace / "pids")) == 3:
            asked_at.append(time.monotonic())
            return "cancelled"
        return None

    result = run_process(
        "for i in 1 2 3; do sleep 30 & echo $! >> pids; done; wait",
        cwd=trial.workspace,
        env=env_for(trial),
        **box(trial),
        limits=quick(kill_grace_seconds=2),
        should_stop=should_stop,
    )

    assert result.cancelled and result.stop_reason == "cancelled" and not result.timed_out
    assert time.monotonic() - asked_at[0] < 2
    assert processes_inside(trial.workspace) == []


def test_it_scrubs_the_environment_to_the_allowlist_and_named_secrets(trial, monkeypatch):
    monkeypatch.setenv("EVALSITE_TEST_UNNAMED_KEY", "unnamed-value")
    monkeypatch.setenv("LANG", "C.UTF-8")
    env = build_env(
        home=trial.home,
        tmpdir=trial.tmp,
        allowlist=DEFAULT_ENV_ALLOWLIST,
        secrets={"ANTHROPIC_API_KEY": "named-value"},
        extra={"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"},
    )

    result = run_process(["env"], cwd=trial.workspace, env=env, limits=quick())

    seen = dict(line.split("=", 1) for line in result.stdout.splitlines())
    assert "EVALSITE_TEST_UNNAMED_KEY" not in seen
    assert "unnamed-value" not in result.stdout
    assert seen["ANTHROPIC_API_KEY"] == "named-value"
    assert seen["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert seen["LANG"] == "C.UTF-8"
    assert seen["HOME"] == str(trial.home)
    assert set(seen) <= {
        *DEFAULT_ENV_ALLOWLIST,
        "HOME",
        "TMPDIR",
        "TMP",
        "TEMP",
        "PWD",
        "ANTHROPIC_API_KEY",
    } | {
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
        process.SANDBOX_ID_VAR,
    }


def test_it_delivers_stdout_lines_live_and_in_order(trial):
    lines: list[str] = []
    # The marker is written after the unterminated tail: stopping on 50 lines alone could kill
    # the shell before its printf ran, and the tail would never have existed.
    tail_written = trial.workspace / "tail-written"

    result = run_process(
        "i=1; while [ $i -le 50 ]; do echo line $i; i=$((i+1)); done; printf 'no newline';"
        " touch tail-written; sleep 30",
        cwd=trial.workspace,
        env=env_for(trial),
        **box(trial),
        limits=quick(),
        on_stdout_line=lines.append,
        should_stop=lambda: "budget" if len(lines) >= 50 and tail_written.exists() else None,
        poll_interval=0.05,
    )

    # The stop came while the command slept: the lines arrived before it ended.
    assert result.stop_reason == "budget" and result.duration_seconds < 5
    assert lines == [f"line {i}" for i in range(1, 51)] + ["no newline"]


def test_it_reraises_a_failing_line_callback_after_killing_the_command(trial):
    def explode(line: str) -> None:
        raise ValueError(f"cannot parse {line!r}")

    started = time.monotonic()
    with pytest.raises(ValueError, match="cannot parse 'hello'"):
        run_process(
            "echo hello; sleep 30",
            cwd=trial.workspace,
            env=env_for(trial),
            **box(trial),
            limits=quick(),
            on_stdout_line=explode,
            poll_interval=0.05,
        )
    assert time.monotonic() - started < 3


def test_it_closes_stdin_unless_bytes_are_given(trial):
    closed = run_process(
        ["cat"], cwd=trial.workspace, env=env_for(trial), **box(trial), limits=quick(wall_seconds=5)
    )
    fed = run_process(
        ["cat"], cwd=trial.workspace, env=env_for(trial), **box(trial), limits=quick(), stdin=b"x" * 300_000
    )

    assert closed.exit_code == 0 and closed.stdout == "" and not closed.timed_out
    assert fed.stdout_total_bytes == 300_000


def test_it_enforces_file_size_cpu_and_address_space_limits(trial):
    env = env_for(trial)
    big = run_process(
        "head -c 2000000 /dev/zero > big.bin",
        cwd=trial.workspace,
        env=env,
        limits=quick(max_file_bytes=1_000_000),
    )
    spin = run_process(
        [PY, "-c", "while True: pass"], cwd=trial.workspace, env=env, limits=quick(cpu_seconds=1)
    )
    hog = run_process(
        [PY, "-c", "b = bytearray(1 << 30)"],
        cwd=trial.workspace,
        env=env,
        limits=quick(address_space_bytes=512 << 20),
    )

    assert big.exit_code != 0 and (trial.workspace / "big.bin").stat().st_size == 1_000_000
    assert spin.signal in (signal.SIGXCPU, signal.SIGKILL) and not spin.timed_out
    assert spin.duration_seconds < 4
    assert hog.exit_code == 1 and "MemoryError" in hog.stderr


@pytest.mark.skipif(not IS_ROOT, reason="needs root to start a worker as an unprivileged user")
def test_it_caps_processes_when_the_worker_is_not_root(base):
    """A non-root worker (here: nobody) gets RLIMIT_NPROC relative to its own thread count."""
    folder = base / "nobody"
    folder.mkdir(mode=0o700)
    shutil.copy(HOSTILE / "spawner.py", folder / "spawner.py")
    done = nobody_worker(
        folder,
        "from runs_app.engine.sandbox import Limits; "
        "from runs_app.engine.sandbox.bubblewrap import run_process; "
        f"r = run_process([{PY!r}, 'spawner.py', '3000'], cwd=Path.cwd(), env={{'PATH': '/usr/bin:/bin'}}, "
        "limits=Limits(wall_seconds=20, max_processes=20)); "
        "print(json.dumps({'report': json.loads(r.stdout), 'leftovers': r.leftovers_killed}))",
    )

    outcome = json.loads(done.stdout or "null") or pytest.fail(done.stderr)
    # Zombies of earlier nobody processes still count against the cap until init reaps them.
    assert 1 <= outcome["report"]["started"] <= 20, done.stderr
    assert processes_inside(folder) == []


@pytest.mark.skipif(not IS_ROOT, reason="needs root to start a worker as an unprivileged user")
def test_a_non_root_workers_sandbox_cannot_read_the_workers_environment(base):
    """Its sandbox runs as the worker's own uid, yet has its own /proc: the worker's environment
    (SECRET_KEY, API keys) is out of reach."""
    folder = base / "nobody"
    folder.mkdir(mode=0o700)
    shutil.copy(HOSTILE / "read_environ.sh", folder / "read_environ.sh")
    done = nobody_worker(
        folder,
        "from runs_app.engine.sandbox import Limits; "
        "from runs_app.engine.sandbox.bubblewrap import run_process; "
        "r = run_process(['/bin/sh', 'read_environ.sh'], cwd=Path.cwd(), env={'PATH': '/usr/bin:/bin'}, "
        "limits=Limits(wall_seconds=20)); print(r.stdout)",
        SECRET_KEY="worker-secret-4b1d",
    )

    assert done.returncode == 0, done.stderr
    assert "environ files read:" in done.stdout
    assert "worker-secret-4b1d" not in done.stdout
    assert "4b1d-terces-rekrow" not in done.stdout  # nor reversed


def test_it_kills_the_command_when_the_worker_dies(trial):
    project = Path(__file__).resolve().parents[3]
    worker_code = (
        f"import sys; sys.path.insert(0, {str(project)!r}); from pathlib import Path; "
        "from runs_app.engine.sandbox import Limits; "
        "from runs_app.engine.sandbox.bubblewrap import run_process; "
        f"run_process('echo started > main.pid; sleep 30', cwd=Path({str(trial.workspace)!r}), "
        "env={'PATH': '/usr/bin:/bin'}, limits=Limits(wall_seconds=30))"
    )
    worker = subprocess.Popen([sys.executable, "-c", worker_code])
    pid_file = trial.workspace / "main.pid"
    try:
        deadline = time.monotonic() + 20
        while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert processes_inside(trial.workspace), "the command did not start"
        worker.kill()
        worker.wait()
        deadline = time.monotonic() + 2
        while processes_inside(trial.workspace) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert processes_inside(trial.workspace) == []
    finally:
        worker.kill()
        worker.wait()


def test_it_removes_cgroups_left_by_a_dead_worker():
    cgroup_base = containment._cgroup_base()
    if cgroup_base is None:
        pytest.skip("this host offers no writable pids cgroup")
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = cgroup_base / f"{gone.pid}-0-stale"
    stale.mkdir()
    orphan = subprocess.Popen(["sleep", "30"])
    (stale / "cgroup.procs").write_text(str(orphan.pid))

    containment._remove_stale_cgroups(cgroup_base)

    assert orphan.wait(timeout=5) == -signal.SIGKILL
    assert not stale.exists()


def test_it_redacts_secret_values():
    text = "key=sk-ant-123456 and again sk-ant-123456, short sk-ant-1"

    assert redact(text, ["sk-ant-123456", "", "sk-ant-1"]) == "key=*** and again ***, short ***"


def test_it_explains_a_missing_secret():
    with pytest.raises(sandbox.SandboxError, match="OPENAI_API_KEY"):
        sandbox.resolve_secrets(["OPENAI_API_KEY"], environ={"OTHER": "x"})


def _remount_cgroup2(target: str, data: bytes) -> None:
    """The raw remount (util-linux's would keep favordynmods): the superblock options become `data`."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    ms_remount, ms_relatime = 32, 1 << 21
    if libc.mount(None, target.encode(), None, ms_remount | ms_relatime, data) != 0:
        raise OSError(ctypes.get_errno(), f"remounting {target}")


def test_a_root_worker_makes_cgroup_moves_wait_for_no_grace_period():
    """Each command joins its own cgroup; without favordynmods every join waited 6-15 ms for
    the kernel (bench/runner_overhead.py). The worker remounts the v2 hierarchy with it."""
    mount = containment._cgroup2_mount()
    kernel = tuple(int(part) for part in os.uname().release.split(".")[:2] if part.isdigit())
    if os.geteuid() != 0 or mount is None or kernel < (6, 0):  # nothing to remount, or no right to
        assert not containment.favor_dynamic_migrations()
        return
    target, options = mount
    kept = ",".join(sorted(options - {"rw", "ro", "favordynmods"}))
    _remount_cgroup2(target, kept.encode())
    assert "favordynmods" not in containment._cgroup2_mount()[1]
    assert containment.favor_dynamic_migrations()
    after = containment._cgroup2_mount()[1]
    assert "favordynmods" in after and options - {"favordynmods"} <= after  # the others kept


def test_a_host_without_mount_8_still_runs_sandboxes(monkeypatch):
    """Favouring cgroup moves is an optimisation: its failure never stops a command."""
    monkeypatch.setattr(containment, "_cgroup2_mount", lambda: ("/sys/fs/cgroup", {"rw"}))
    monkeypatch.setenv("PATH", "/nonexistent")
    assert containment.favor_dynamic_migrations() is False
