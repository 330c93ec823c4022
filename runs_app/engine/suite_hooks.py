"""A run's `hooks.suite`: set up once, on one worker host, before its first trial; torn down there
once the run has ended, whatever happened.

The suite lives in a sandbox of its own (the same bubblewrap sandbox as a trial's: its folder
writable, the system read-only, loopback only), held open for the whole run by a thread of the
worker process that claimed it:

1. a driver script runs each `setup` command in turn (its output to a file, its exit code marked
   on stdout), stopping at the first failure; what a command leaves running in the background (a
   fixture service) keeps running;
2. it says whether setup passed, then waits until the worker creates the teardown trigger (the
   run has ended, or setup failed);
3. it runs every `teardown` command in the same sandbox (the same processes are visible, so a
   teardown can stop the service), and exits; whatever is left is killed.

Trials of the run go only to workers of this host, and see the suite's folder read-only at
$EVALSITE_SUITE_DIR (a service there listens on a unix socket: the sandboxes have no network).
The holding thread renews the suite's lease on the run's row; when it stops (the worker died),
the reaper sets the suite up again elsewhere. Run control is reached through callbacks.
"""

import logging
import os
import secrets
import shlex
import shutil
import stat
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path, PurePosixPath

from django.conf import settings
from django.db import close_old_connections
from django.db.models import F
from django.utils import timezone

from experiments_app.specs.bundles import extract_bundle
from runs_app import live
from runs_app.engine.bundle_cache import bundle_blob
from runs_app.engine.outcome import step_failure
from runs_app.engine.sandbox import (
    Mount,
    Phase,
    ProcessResult,
    Sandbox,
    SandboxPaths,
    phase_limits,
    workspace,
)
from runs_app.engine.trial_sandbox import host_caps, host_folder, open_host_sandbox
from runs_app.models import Run

logger = logging.getLogger(__name__)

TRIGGER = ".evalsite-teardown"  # created in the suite's folder when teardown should start
LOG_DIR = "/tmp/evalsite-suite"  # each command's output, inside the suite's sandbox
OUTPUT_CHARS = 4000

Callback = Callable[[int, str], None]


def suite_of(config: dict) -> dict:
    """A run's frozen `hooks.suite` (the experiment's defaults; nothing else may set it)."""
    defaults = ((config or {}).get("experiment") or {}).get("defaults") or {}
    return ((defaults.get("hooks") or {}).get("suite")) or {}


def has_suite(config: dict) -> bool:
    suite = suite_of(config)
    return bool(suite.get("setup") or suite.get("teardown"))


def claim(run_id: int, worker: str) -> bool:
    """Take the run's suite to set it up (a conditional UPDATE: one worker wins)."""
    return (
        Run.objects.filter(pk=run_id, suite_status=Run.Suite.PENDING, cancel_requested=False).update(
            suite_status=Run.Suite.SETTING_UP,
            suite_host=settings.WORKER_HOST,
            suite_owner=worker,
            suite_lease_expires_at=timezone.now() + timedelta(seconds=settings.TRIAL_LEASE_SECONDS),
            suite_dir="",
            suite_attempt=F("suite_attempt") + 1,
        )  # fmt: skip
        == 1
    )


class SuiteHolder(threading.Thread):
    """Holds one run's suite sandbox from setup to teardown (see the module docstring).
    `on_ready(run_id, "")` once setup passed; `on_failed(run_id, why)` when it did not."""

    def __init__(self, run_id: int, worker: str, on_ready: Callback, on_failed: Callback):
        super().__init__(daemon=True, name=f"suite-{run_id}")
        self.run_id, self.worker = run_id, worker
        self.on_ready, self.on_failed = on_ready, on_failed
        self.token = secrets.token_hex(8)
        self.box: Sandbox | None = None
        self.paths: SandboxPaths | None = None
        self.steps: dict[str, list[dict]] = {}
        self.failures: list[str] = []
        self.seen: list[str] = []  # the driver's markers so far
        self.setup_done = threading.Event()
        self.next_renewal = 0.0
        self.lost = False

    def run(self) -> None:
        try:
            self._hold()
        except Exception as exc:  # the harness itself failed: the run must not wait forever
            logger.exception("run %s: the suite failed in the harness", self.run_id)
            if not self.setup_done.is_set():
                self._failed(f"the suite could not be set up: {type(exc).__name__}: {exc}")
        finally:
            if self.box is not None:
                self.box.cleanup()
            self._owned().filter(suite_status=Run.Suite.READY).update(suite_status=Run.Suite.TORN_DOWN)
            close_old_connections()

    def _hold(self) -> None:
        run = Run.objects.get(pk=self.run_id)
        hooks = suite_of(run.config)
        self.steps = {phase: list(hooks.get(phase) or []) for phase in ("setup", "teardown")}
        self.box = self._open(run)
        self.paths = self.box.started
        Run.objects.filter(pk=self.run_id, suite_owner=self.worker).update(
            suite_dir=str(self.paths.workspace)
        )
        extra = {
            "EVALSITE_SUITE_TOKEN": self.token, "EVALSITE_SUITE_DIR": str(self.paths.workspace),
            "EVALSITE_RUN_ID": str(self.run_id),
        }  # fmt: skip
        result = self.box.exec(
            ["/bin/sh", "-c", _driver(self.steps, self.paths.workspace / TRIGGER)],
            env=extra,
            limits=phase_limits(Phase.SUITE, host_caps({}), 0),
            on_stdout_line=self._marker,
            should_stop=self._tick,
            poll_interval=1.0,
        )  # fmt: skip
        if not self.setup_done.is_set():  # it ended before saying how setup went
            self._failed(f"the suite's sandbox ended during setup{_how(result)}")
        elif "done" not in self.seen and not self.lost:
            self.failures.append(f"the suite's sandbox ended before teardown finished{_how(result)}")
        if self.failures:
            self._owned().update(suite_error="; then ".join(self.failures))
        self._owned().update(suite_lease_expires_at=None)
        live.publish(self.run_id)

    def _open(self, run: Run) -> Sandbox:
        """The suite's sandbox: the experiment's files (its YAML's folder) in its workspace, which
        every trial of the run may read."""
        box = open_host_sandbox(host_folder(f"suite-{run.pk}-a{run.suite_attempt}"), host_caps({}))
        paths = box.started
        box.shared.append(Mount(paths.home, writable=True))
        root = paths.root
        experiment = (run.config or {}).get("experiment") or {}
        if experiment.get("bundle"):
            bundle = root / "experiment"
            extract_bundle(bundle_blob(experiment["bundle"]), bundle)
            source = bundle / str(PurePosixPath(experiment.get("yaml_path") or ".").parent)
            shutil.copytree(source, paths.workspace, dirs_exist_ok=True)
            shutil.rmtree(bundle)
        if paths.uid is not None:
            workspace.chown_tree(paths.workspace, paths.uid, paths.uid)
        _readable_by_all(paths.workspace)  # the trials' sandbox uids read it (never write)
        return box

    # --- what the driver says, and the clock ------------------------------------------------------

    def _marker(self, line: str) -> None:
        prefix = f"\x1e{self.token} "
        if not line.startswith(prefix):
            return
        words = line[len(prefix) :].split()
        self.seen.append(words[0])
        if words[0] == "end" and len(words) == 4:
            self._step_ended(words[1], int(words[2]), words[3])
        elif words[0] == "ready":
            self.setup_done.set()
            if words[1:] == ["0"]:
                self._owned().filter(suite_status=Run.Suite.SETTING_UP).update(suite_status=Run.Suite.READY)
                live.publish(self.run_id)
                self.on_ready(self.run_id, "")
            else:
                self._failed("; ".join(self.failures) or "the suite's setup failed")
                self._trigger()

    def _step_ended(self, phase: str, index: int, code: str) -> None:
        step = self.steps[phase][index]
        assert self.paths is not None  # markers come from the sandbox it opened
        log = self.paths.tmp / "evalsite-suite" / f"{phase}-{index}.log"
        try:
            output = log.read_text(errors="replace")[-OUTPUT_CHARS:]
        except OSError:
            output = ""
        timed_out = code == "124"
        entry = {
            "step": f"hooks.suite.{phase}[{index}]", "command": step["command"], "exit_code": int(code),
            "timed_out": timed_out, "output": output, "at": timezone.now().isoformat(),
        }  # fmt: skip
        if code != "0":
            self.failures.append(step_failure(entry["step"], step["command"], int(code), timed_out, output))
        run = Run.objects.filter(pk=self.run_id).values_list("suite_log", flat=True).first() or []
        self._owned().update(suite_log=[*run, entry])
        live.publish(self.run_id)

    def _tick(self) -> str | None:
        """Every second: renew the lease (as a trial's is); start teardown once the run has ended."""
        now = time.monotonic()
        if now >= self.next_renewal:
            self.next_renewal = now + settings.TRIAL_LEASE_SECONDS / 3
            expires = timezone.now() + timedelta(seconds=settings.TRIAL_LEASE_SECONDS)
            if not self._owned().update(suite_lease_expires_at=expires):
                # Taken over (this host looked dead): tear down here all the same.
                self.lost = True
                self._trigger()
        if self.setup_done.is_set():
            status = Run.objects.filter(pk=self.run_id).values_list("status", flat=True).first()
            if status in (Run.Status.FINISHED, Run.Status.CANCELLED, None):
                self._trigger()
        close_old_connections()
        return None

    def _trigger(self) -> None:
        if self.paths is not None:
            (self.paths.workspace / TRIGGER).touch()

    def _owned(self):
        return Run.objects.filter(pk=self.run_id, suite_owner=self.worker)

    def _failed(self, why: str) -> None:
        self._owned().update(suite_status=Run.Suite.FAILED, suite_error=why)
        live.publish(self.run_id)
        self.on_failed(self.run_id, why)


def _driver(steps: dict[str, list[dict]], trigger: Path) -> str:
    """The suite sandbox's script (see the module docstring); markers go to stdout as
    `\\x1e<token> end <phase> <index> <exit code>`, `ready <0|1>` and `done`."""
    lines = [
        # The worker's umask (077: settings.py) would make what setup writes 0600 to the suite's
        # uid, which no trial's uid can read; the folder is there for the trials to read.
        "umask 022",
        'mark() { printf "\\036%s %s\\n" "$EVALSITE_SUITE_TOKEN" "$*"; }',
        f"mkdir -p {LOG_DIR}",
        "failed=0",
    ]

    def step(phase: str, index: int, hook: dict) -> str:
        timeout = int(hook.get("timeout", 60))
        log = f"{LOG_DIR}/{phase}-{index}.log"
        return (
            f"timeout -k 5 {timeout} /bin/sh -c {shlex.quote(hook['command'])} </dev/null >{log} 2>&1; "
            f"code=$?; mark end {phase} {index} $code"
        )

    for index, hook in enumerate(steps.get("setup") or []):
        lines.append(
            f'if [ "$failed" = 0 ]; then {step("setup", index, hook)}; [ "$code" = 0 ] || failed=1; fi'
        )
    lines.append('mark ready "$failed"')
    lines.append(f"while [ ! -e {shlex.quote(str(trigger))} ]; do sleep 0.5; done")
    lines += [step("teardown", index, hook) for index, hook in enumerate(steps.get("teardown") or [])]
    lines.append("mark done")
    return "\n".join(lines)


def _readable_by_all(folder: Path) -> None:
    """What the experiment brought, readable (and folders searchable) by every uid; never
    through a symlink."""
    os.chmod(folder, 0o755)
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            mode = os.lstat(path).st_mode
            if not stat.S_ISLNK(mode):
                os.chmod(path, stat.S_IMODE(mode) | (0o755 if stat.S_ISDIR(mode) else 0o644))


def _how(result: ProcessResult) -> str:
    if result.timed_out:
        return " (it ran out of time)"
    if result.signal:
        return f" (signal {result.signal})"
    return f" (exit {result.exit_code}): {result.stderr.strip()[-300:]}" if result.stderr.strip() else ""
