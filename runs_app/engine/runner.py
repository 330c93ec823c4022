"""Executing one trial: claim, build the sandbox, run the agent, grade, persist, clean up.

Plain Python around the pure modules (workspace, sandbox, agents, criteria). `control.execute`
claims a trial here and runs it (`run_claimed`), then decides what the worker does next; the
engine never reaches back into run control.

1. Claim with a conditional UPDATE (queued -> running, with a lease); no row means another
   worker has it, or it already ended (a redelivered message): do nothing.
2. The process's lease keeper (one thread for all its trials) renews the lease and watches
   the run's cancel flag twice a second.
3. Setup: the task (and experiment) bundles, unpacked once per host; template sources; pre_run.
4. Agent: prepare, run under process control; every stdout line is parsed live into events
   and usage, and a crossed budget or a fatal stream error stops it at once.
5. Grade the finished workspace (unless the agent errored or was cancelled), run post_run.
6. Persist everything in one transaction, conditional on still holding the lease.
"""

import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path, PurePosixPath
from typing import Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import close_old_connections, connection, transaction
from django.utils import timezone

from evalsite.versioning import code_version
from experiments_app.models import TaskVersion
from runs_app import live, written
from runs_app.engine import (
    bundle_cache,
    criteria,
    environments,
    gateway,
    roles,
    sandbox,
    workspace,
)
from runs_app.engine.agent_phase import AgentPhase
from runs_app.engine.criteria import early_stop
from runs_app.engine.leases import Heartbeat, release_connection
from runs_app.engine.outcome import Outcome, TrialAborted
from runs_app.engine.recording import Recorder, redact
from runs_app.models import CriterionResult, Run, Trial, TrialEvent

logger = logging.getLogger(__name__)

# The final reply kept with the trajectory criteria read (for `evaluate` to grade it again).
FINAL_TEXT_CAP = 100_000
COMMAND_LIMITS = {"address_space_bytes": 4 << 30, "max_processes": 256, "max_file_bytes": 1 << 30}


OnStored = Callable[[Run, Trial, list[CriterionResult]], None]


# A trial's claim, written out: every trial takes it, and the ORM spent ~2 ms of a trivial
# trial's CPU composing these two statements. The conditions are the ORM version's:
# - not cancelled;
# - the run's code version, or any: a message that reached a worker of another code version
#   (sent before a run was recorded, or by hand) is left for a worker of the run's own version;
# - a run with suite hooks: only once its suite is up, and only on its host.
_CLAIMABLE = """
    id = %s AND status = %s AND run_id IN (
        SELECT id FROM runs_app_run
        WHERE NOT cancel_requested
          AND (any_code_version OR code_version IN ('', %s))
          AND (suite_status = '' OR (suite_status = %s AND suite_host = %s))
    )"""
_COUNT_CLAIMED = """
    UPDATE runs_app_run
    SET n_running = n_running + 1, n_queued = CASE WHEN n_queued > 0 THEN n_queued - 1 ELSE 0 END
    WHERE id = (SELECT run_id FROM runs_app_trial WHERE id = %s)"""


def claim(trial_id: int, worker: str) -> bool:
    """Take a queued trial (a conditional UPDATE: no row means another worker has it) and count
    it as running on its run. The run's row is updated after the trial's, by a relative UPDATE:
    a recount holding the run's lock meanwhile either saw this trial running or is followed
    by the +1."""
    now = timezone.now()
    running = {
        "status": Trial.Status.RUNNING, "lease_owner": worker, "host": settings.WORKER_HOST,
        "lease_expires_at": now + timedelta(seconds=settings.TRIAL_LEASE_SECONDS), "started_at": now,
    }  # fmt: skip
    with transaction.atomic():
        claimed = written.update(
            Trial, running, _CLAIMABLE,
            [trial_id, Trial.Status.QUEUED, code_version(), Run.Suite.READY, settings.WORKER_HOST],
        ) == 1  # fmt: skip
        if claimed:
            with connection.cursor() as cursor:
                cursor.execute(_COUNT_CLAIMED, [trial_id])
    return claimed


def run_claimed(trial_id: int, worker: str, on_stored: OnStored | None = None) -> tuple[str | None, int]:
    """Run a trial this worker has claimed to its final state. Returns the stored status (None
    when the lease was lost before saving: another attempt owns the trial) and the run's id.
    `on_stored(run, trial, criteria)` runs in the transaction that stores the outcome, with
    the run's row locked (the caller counts the outcome there: exactly once)."""
    trial = load_trial(trial_id)
    if trial.run.status == trial.run.Status.QUEUED:
        Run.objects.mark_started(trial.run_id)
    execution = TrialExecution(trial, worker)
    try:
        outcome = execution.run()
    except Exception as exc:  # the harness itself failed: never a "failed" trial
        logger.exception("trial %s crashed in the harness", trial_id)
        outcome = Outcome(Trial.Status.ERROR, "harness", f"{type(exc).__name__}: {exc}")
    finally:
        execution.stop_heartbeat()
    stored = execution.persist(outcome, on_stored)
    return (outcome.status if stored else None), trial.run_id


# What a trial's execution reads of its run: not the bulky JSON (the frozen config names every
# task of the run: a few MB for a large run, parsed again for every trial).
RUN_FIELDS = tuple(f.name for f in Run._meta.concrete_fields if f.name not in Run.BULKY_FIELDS)
_VERSIONS: dict[int, TaskVersion] = {}  # task versions never change: read once per process
_EXPERIMENTS: dict[int, dict] = {}  # the frozen config's "experiment" of each run, likewise
_CACHED_MAX = 256


def load_trial(trial_id: int) -> Trial:
    """The trial with its run (without the bulky fields) and its task version (bundle, YAML
    path, task slug). Two written-out statements: the ORM's five-table join cost ~1 ms of CPU
    a trial, and read the version's whole spec and dataset each time."""
    trial = written.fetch(Trial, "id = %s", [trial_id])[0]
    trial.run = written.fetch(Run, "id = %s", [trial.run_id], RUN_FIELDS)[0]
    version = _VERSIONS.get(trial.task_version_id)
    if version is None:
        version = (
            TaskVersion.objects.select_related("task")
            .only("bundle_id", "yaml_path", "number", "task__slug")
            .get(pk=trial.task_version_id)
        )
        _remember(_VERSIONS, trial.task_version_id, version)
    trial.task_version = version
    return trial


def experiment_of(run_id: int) -> dict:
    """The run's frozen experiment settings (its bundle and YAML path), read once per process."""
    found = _EXPERIMENTS.get(run_id)
    if found is None:
        found = Run.objects.filter(pk=run_id).values_list("config__experiment", flat=True).get() or {}
        _remember(_EXPERIMENTS, run_id, found)
    return found


def _remember(cache: dict, key: int, value: Any) -> None:
    if len(cache) >= _CACHED_MAX:
        cache.pop(next(iter(cache)))
    cache[key] = value


def forget() -> None:
    """Drop what `load_trial` and `experiment_of` keep (tests: ids repeat across test databases)."""
    _VERSIONS.clear()
    _EXPERIMENTS.clear()


class TrialExecution:
    def __init__(self, trial: Trial, worker: str):
        self.trial = trial
        self.worker = worker
        self.config: dict = trial.config
        self.secret_values: list[str] = []
        self.heartbeat = Heartbeat(trial, worker)
        self.recorder = Recorder(
            trial.pk, self.secret_values, first_attempt=trial.attempt == 1, run_id=trial.run_id,
            lease=self.heartbeat,
        )  # fmt: skip
        self.paths: workspace.SandboxPaths | None = None
        self.agent_process_seconds = 0.0
        self.root: Path | None = None
        self.early_stop: early_stop.EarlyStop | None = None
        # Tokens and cost of the model calls the worker made for the trial itself, by role
        # (answerer, judge); the agent's are the trial's own columns.
        self.role_usage: dict[str, dict] = {}
        self.dialog: list[dict] = []  # a simulated conversation, for the criteria
        self.conversation_end: dict = {}  # how it ended: {"reason", "turns"}
        # The run's suite folder (hooks.suite), which every command of the trial reads.
        ready = trial.run.suite_status == Run.Suite.READY and trial.run.suite_dir
        self.suite_dir = Path(trial.run.suite_dir) if ready else None

    # --- the phases ---------------------------------------------------------------------------

    def run(self) -> Outcome:
        self.heartbeat.start()
        timings: dict[str, float] = {}
        started = time.perf_counter()
        # Not written at once: the claim showed the trial running, and a trial's first write
        # cost a transaction of its own. A setup that takes a while is written while its
        # commands run (`_waiting`), a quick one with what follows.
        self.recorder.phase("setup", worker=self.worker, attempt=self.trial.attempt)
        try:
            self.setup()
        except (TrialAborted, workspace.WorkspaceError, sandbox.SandboxError) as exc:
            category = exc.category if isinstance(exc, TrialAborted) else "setup"
            return self._ended(Outcome(Trial.Status.ERROR, category, str(exc)), timings, started)
        timings["setup"] = time.perf_counter() - started
        if reason := self.heartbeat.stop_reason():
            return self._ended(self.stopped(reason), timings, started)
        outcome = self._after_setup(timings)
        return self._ended(self._after_hooks(outcome), timings, started)

    def _after_setup(self, timings: dict[str, float]) -> Outcome:
        """The before hooks, the agent and the grading; `hooks.trial.after` follows whatever
        this returns."""
        if self._hooks("before"):
            self.recorder.phase("hooks_before")
        if failure := self._run_hooks("before", stop_at_first=True):
            return Outcome(Trial.Status.ERROR, "hook", failure)
        before = workspace.snapshot(self.paths.workspace, self._ignore_patterns())
        agent_started = time.perf_counter()
        # Written with what follows, or while the agent runs (its first poll, within a second):
        # not in a transaction of its own, as for the setup.
        self.recorder.phase("agent", kind=self.agent_kind())
        outcome = AgentPhase(self).run()
        timings["agent"] = time.perf_counter() - agent_started
        after = workspace.snapshot(self.paths.workspace, self._ignore_patterns())
        outcome.diff, outcome.diff_truncated = workspace.unified_diff(before, after, settings.DIFF_CAP_BYTES)
        if outcome.status in (Trial.Status.ERROR, Trial.Status.CANCELLED):
            return outcome

        grading_started = time.perf_counter()
        # What was spent so far is stored before a model is asked to grade (a long call).
        self.recorder.phase("grading", flush=judged(self.config.get("success_criteria") or []))
        self.grade(outcome)
        timings["grading"] = time.perf_counter() - grading_started
        self.recorder.phase("post_run")
        self.run_steps("post_run", fatal=False)
        return outcome

    def _hooks(self, which: str) -> list[dict]:
        return ((self.config.get("hooks") or {}).get("trial") or {}).get(which) or []

    def _run_hooks(self, which: str, stop_at_first: bool) -> str:
        """Run `hooks.trial.<which>` in the sandbox; what failed, in words ("" when none did)."""
        failures = []
        for index, hook in enumerate(self._hooks(which)):
            result = self.run_command(hook["command"], float(hook.get("timeout", 60)), grading=False)
            if failure := self._record_step(f"hooks.trial.{which}[{index}]", hook["command"], result):
                failures.append(failure)
                if stop_at_first:
                    break
        return "; ".join(failures)

    def _after_hooks(self, outcome: Outcome) -> Outcome:
        """`hooks.trial.after`, whatever the outcome: a failure makes the trial an error and is
        reported with the error it followed, if any."""
        if not self._hooks("after"):
            return outcome
        self.recorder.phase("hooks_after")
        failure = self._run_hooks("after", stop_at_first=False)
        if not failure:
            return outcome
        if outcome.status in (Trial.Status.ERROR, Trial.Status.CANCELLED) and outcome.error_message:
            failure = f"{outcome.error_message}; then {failure}"
        outcome.status, outcome.error_category, outcome.error_message = Trial.Status.ERROR, "hook", failure
        return outcome

    def _ended(self, outcome: Outcome, timings: dict[str, float], started: float) -> Outcome:
        timings["total"] = time.perf_counter() - started
        outcome.timings = timings
        if self.trial.run.keep_artifacts and self.paths is not None:
            outcome.artifact = self._save_artifact()
        self.cleanup()
        self.recorder.phase(
            "finished",
            status=outcome.status,
            error=outcome.error_message[:500],
            seconds=round(timings["total"], 4),
            agent_process_seconds=round(self.agent_process_seconds, 4),
        )
        return outcome

    def stopped(self, reason: str) -> Outcome:
        if reason == "cancelled":
            return Outcome(Trial.Status.CANCELLED, "cancelled", "the run was cancelled")
        return Outcome(Trial.Status.ERROR, "lost", "this worker lost the trial's lease")

    def setup(self) -> None:
        if (self.config.get("sandbox") or {}).get("driver") == "docker":  # launches refuse these
            raise TrialAborted("setup", "sandbox.driver: docker: this worker runs no containers")
        self.prepare()
        sources = (self.config.get("sandbox") or {}).get("template_sources") or []
        for index, source in enumerate(sources):
            bundle_dir, yaml_dir = self.origin(f"sandbox.template_sources[{index}]")
            workspace.materialize(
                self.paths.workspace, [source], bundle_dir, yaml_dir, ignore_patterns=self._ignore_patterns(),
                first_index=index, git=self._git,
            )  # fmt: skip
        self._provide_venv()
        self.recorder.phase("pre_run")
        self.run_steps("pre_run", fatal=True)

    def prepare(self) -> None:
        """The trial's sandbox folders and its task (and experiment) bundle."""
        token = uuid.uuid4().hex[:8]
        root = Path(settings.TRIAL_ROOT) / f"trial-{self.trial.pk}-a{self.trial.attempt}-{token}"
        Path(settings.TRIAL_ROOT).mkdir(parents=True, exist_ok=True)
        os.chmod(settings.TRIAL_ROOT, 0o711)
        self.root = root
        self.paths = workspace.layout(root)
        version = self.trial.task_version
        self.task_bundle_dir = bundle_cache.unpacked(version.bundle_id)
        self.task_yaml_dir = str(PurePosixPath(version.yaml_path).parent)
        self.experiment_bundle_dir: Path | None = None
        experiment = experiment_of(self.trial.run_id)
        if experiment.get("bundle"):
            self.experiment_bundle_dir = bundle_cache.unpacked(experiment["bundle"])
            self.experiment_yaml_dir = str(PurePosixPath(experiment.get("yaml_path") or ".").parent)

    def _provide_venv(self) -> None:
        """coder-eval's per-sandbox virtualenv (`sandbox.python`, on unless null): `.venv` in the
        workspace, with system site packages, first on the PATH of run_command criteria (not of
        pre_run, post_run or the agent, as in coder-eval 0.12.16). It is made like one template venv per
        host (a venv of symlinks and a pyvenv.cfg, from its listing), not by `python -m venv`. The
        `env_packages` of `sandbox.python` and `sandbox.node` come from environments built on
        the host once per requirement set and mounted read-only (`environments`)."""
        self.venv_env: dict[str, str] = {}
        self.env_mounts: list[sandbox.Mount] = []
        box = self.config.get("sandbox") or {}
        root = Path(settings.SANDBOX_ROOT)
        path = [os.environ.get("PATH", os.defpath)]
        try:
            node_env = (box.get("node") or {}).get("env_packages") and environments.node_packages(
                root, list(box["node"]["env_packages"])
            )
            python = box.get("python", {})
            python_env = (
                python is not None
                and python.get("env_packages")
                and environments.python_packages(root, list(python["env_packages"]))
            )
        except environments.InstallError as exc:
            raise TrialAborted(
                "setup", f"installing the task's env_packages on the worker host: {exc}"
            ) from None
        if node_env:
            self.env_mounts.append(sandbox.Mount(node_env))
            link = self.paths.workspace / "node_modules"
            if not link.exists():
                link.symlink_to(node_env / "node_modules")
            path.insert(0, str(link / ".bin"))
            self.venv_env |= {"NODE_PATH": "", "NPM_CONFIG_PREFIX": str(self.paths.home / ".npm-prefix")}
        if python is not None:
            target = self.paths.workspace / VENV_DIRNAME
            if not target.exists():
                environments.new_venv(root, target, owner=self.paths.uid)
                if python_env:
                    self.env_mounts.append(sandbox.Mount(python_env))
                    environments.link_python_packages(target, python_env)
                    if self.paths.uid is not None:
                        workspace.chown_tree(target, self.paths.uid, self.paths.uid)
            path.insert(0, str(target / "bin"))
            self.venv_env["VIRTUAL_ENV"] = str(target)
        if len(path) > 1:
            self.venv_env["PATH"] = os.pathsep.join(path)

    def origin(self, lineage_key: str) -> tuple[Path, str]:
        """Where a relative path of this config field resolves: the task's YAML folder, or
        the experiment's when an experiment, variant or override layer set it."""
        layer = self.trial.lineage.get(lineage_key, "task")
        if layer in ("experiment", "variant", "override") and self.experiment_bundle_dir is not None:
            return self.experiment_bundle_dir, self.experiment_yaml_dir
        return self.task_bundle_dir, self.task_yaml_dir

    def run_steps(self, name: str, *, fatal: bool) -> None:
        for index, step in enumerate(self.config.get(name) or []):
            result = self.run_command(step["command"], float(step.get("timeout", 30)), grading=False)
            failure = self._record_step(f"{name}[{index}]", step["command"], result)
            if failure and fatal and step.get("fail_on_error", True):
                raise TrialAborted(name, failure)

    def _record_step(self, step: str, command: str, result: criteria.CommandOutcome) -> str:
        """Record a step's output; what went wrong, in words ("" when it succeeded)."""
        self.recorder.add(
            TrialEvent.Kind.OUTPUT,
            {
                "step": step,
                "command": command,
                "exit_code": result.exit_code,
                "stdout": result.stdout[-4000:],
                "stderr": result.stderr[-4000:],
                "timed_out": result.timed_out,
            },
        )
        if not result.timed_out and result.exit_code == 0:
            return ""
        why = "timed out" if result.timed_out else f"exited with {result.exit_code}"
        return f"{step} `{command}` {why}: {result.stderr[-500:].strip()}"

    def run_command(self, command: str, timeout: float, grading: bool = True) -> criteria.CommandOutcome:
        """A shell command in the trial's sandbox (pre_run, post_run, run_command criteria). Only
        grading sees the task's files and reference solution (read-only): $TASK_DIR, $REFERENCE_DIR."""
        limits = sandbox.Limits(
            wall_seconds=timeout, cpu_seconds=max(1, int(timeout * 2)), stdout_cap_bytes=1 << 20,
            memory_bytes=self.memory_bytes(), **COMMAND_LIMITS,
        )  # fmt: skip
        mounts, extra = [], {}
        if grading:  # coder-eval: the venv, node_modules/.bin and TASK_DIR are run_command's only
            mounts.append(sandbox.Mount(self.task_bundle_dir))
            extra = {
                **getattr(self, "venv_env", {}),
                "TASK_DIR": str(self.task_bundle_dir / self.task_yaml_dir),
            }
            extra |= self._reference_env()
        result = self.sandboxed(command, limits=limits, extra=extra, mounts=mounts)
        exit_code = result.exit_code if result.exit_code is not None else 128 + (result.signal or 9)
        return criteria.CommandOutcome(exit_code, result.stdout, result.stderr, result.timed_out)

    def budget(self, role: str) -> dict:
        return (self.config.get("budgets") or {}).get(role) or {}

    def account(self, client: roles.RoleClient) -> None:
        """A role's calls into the transcript and its totals onto the trial."""
        for call in client.drain():
            self.recorder.add(TrialEvent.Kind.USAGE, call)
        totals = roles.usage_summary(client.totals())
        previous = self.role_usage.get(client.role)
        if previous:  # the judge of every turn (check_criteria), then the last
            totals = {key: previous.get(key, 0) + value for key, value in totals.items()}
        self.role_usage[client.role] = totals

    def grade(self, outcome: Outcome) -> None:
        agent = self.agent
        tool_calls = criteria.graded_calls(agent.tool_calls)
        if outcome.stopped_early and self.early_stop is not None:
            # The agent was stopped at the deciding call; calls it printed while the stop was
            # on its way never happened as far as the verdict goes.
            tool_calls = tool_calls[: self.early_stop.tool_call_index]
        context = criteria.GradingContext(
            workspace=self.paths.workspace,
            tool_calls=tool_calls,
            final_text=agent.final_text,
            run_command=self.run_command,
            dataset_row=self.trial.dataset_row,
            env=dict(os.environ),
            task_dir=self.task_bundle_dir / self.task_yaml_dir,
            reference_dir=self.reference_dir(),
            shared_roots=tuple(mount.path for mount in getattr(self, "env_mounts", [])),
            dialog=self.dialog,
        )
        specs = self.config.get("success_criteria") or []
        judge = self._judge_client(specs)
        context.post_model = judge.post if judge is not None else None
        try:
            result = criteria.grade(specs, context)
        finally:
            if judge is not None:
                judge.close()
                self.account(judge)
        outcome.trajectory = {"tool_calls": tool_calls, "final_text": agent.final_text[:FINAL_TEXT_CAP]}
        if self.dialog:
            outcome.trajectory["dialog"] = self.dialog
            outcome.trajectory["conversation"] = self.conversation_end
        if outcome.stopped_early:
            result.passed = not result.error and early_stop.armed_gate_passed(
                specs, result.criteria, early_stop.gate_threshold(self.config)
            )
        outcome.criteria = result.criteria
        outcome.score = result.score
        if result.error:
            outcome.status = Trial.Status.ERROR
            outcome.error_category = "grader"
            outcome.error_message = result.error
        else:
            outcome.status = Trial.Status.PASSED if result.passed else Trial.Status.FAILED

    def _judge_client(self, specs: list[dict]) -> roles.RoleClient | None:
        """The judge's own gateway, when a criterion asks a model: its calls are the judge's
        (counted, priced, `budgets.judge`). Without a key there is none, and the criterion says
        which key to set."""
        if not judged(specs):
            return None
        try:
            _, upstream = roles.endpoint(os.environ, "EVALSITE_JUDGE_PROVIDER")
        except roles.ModelCallError:
            return None
        self.secret_values.append(upstream.key)
        return roles.RoleClient("judge", self.root / "judge.sock", upstream, self.budget("judge"))

    # --- helpers ---------------------------------------------------------------------------------

    def agent_kind(self) -> str:
        return (self.config.get("agent") or {}).get("type") or "claude-code"

    def sandboxed(
        self,
        argv: list[str] | str,
        *,
        limits: sandbox.Limits,
        secrets: dict[str, str] | None = None,
        extra: dict[str, str] | None = None,
        mounts: list[sandbox.Mount] | None = None,
        via: gateway.Gateway | None = None,
        **options: Any,
    ) -> sandbox.ProcessResult:
        """One command in the trial's sandbox: its workspace, HOME and /tmp, plus `mounts`; with
        `via`, behind that gateway (the forwarder on the sandbox's loopback, its socket mounted)."""
        mounts = [
            sandbox.Mount(self.paths.home, writable=True),
            *getattr(self, "env_mounts", []),
            *([sandbox.Mount(self.suite_dir)] if self.suite_dir else []),
            *(mounts or []),
        ]
        extra = dict(extra or {})
        if via is not None:
            forwarder = sandbox.forwarder(Path(settings.SANDBOX_ROOT))
            argv = gateway.wrap_command(list(argv), via.socket_path, forwarder)
            mounts += [sandbox.Mount(via.socket_path), sandbox.Mount(forwarder)]
            if self.paths.uid is not None:
                os.chown(via.socket_path, self.paths.uid, self.paths.uid)
            extra = {**via.sandbox_env(), **extra}
        options.setdefault("should_stop", self._waiting)
        release_connection()
        return sandbox.run_process(
            argv,
            cwd=self.paths.workspace,
            env=self._env(secrets=secrets, extra=extra),
            limits=limits,
            mounts=mounts,
            tmp=self.paths.tmp,
            stage_root=Path(settings.SANDBOX_ROOT) / "runtimes",
            **options,
        )

    def _waiting(self) -> str | None:
        """Polled while a command runs: the events that waited long enough are written, and a
        cancel or a lost lease stops the command."""
        self.recorder.flush_if_due()
        return self.heartbeat.stop_reason()

    def _git(self, argv: list[str], timeout: float, host: str) -> tuple[int, str, bool]:
        """git (cloning a repo source) in the trial's sandbox, whose only way out is a CONNECT
        proxy to the repository's `host`; the scrubbed environment, no credentials."""
        proxy = gateway.Gateway(self.root / "git.sock", [], allowed_hosts=[host]).start()
        try:
            limits = sandbox.Limits(wall_seconds=timeout, memory_bytes=self.memory_bytes(), **COMMAND_LIMITS)
            result = self.sandboxed(argv, limits=limits, extra={"GIT_TERMINAL_PROMPT": "0"}, via=proxy)
        finally:
            proxy.close()
        return (result.exit_code if result.exit_code is not None else -1), result.stderr, result.timed_out

    def disk_bytes(self) -> int:
        box = (self.config.get("sandbox") or {}).get("limits") or {}
        return int(box.get("max_disk_mb") or settings.SANDBOX_DISK_MB) << 20

    def memory_bytes(self) -> int:
        box = (self.config.get("sandbox") or {}).get("limits") or {}
        return int(box.get("max_memory_mb") or settings.SANDBOX_MEMORY_MB) << 20

    def reference_dir(self) -> Path | None:
        reference = self.config.get("reference") or {}
        directory = reference.get("directory") if isinstance(reference, dict) else None
        if not directory:
            return None
        bundle_dir, yaml_dir = self.origin("reference.directory")
        folder = (bundle_dir / yaml_dir / directory).resolve()
        if not folder.is_relative_to(bundle_dir.resolve()):
            # An override could name any folder of the worker; the oracle would copy it in.
            raise TrialAborted("setup", f"reference.directory {directory!r} leaves the task's bundle")
        return folder

    def _reference_env(self) -> dict[str, str]:
        reference = self.reference_dir()
        return {"REFERENCE_DIR": str(reference)} if reference else {}

    def _ignore_patterns(self) -> list[str]:
        return list((self.config.get("sandbox") or {}).get("ignore_patterns") or [])

    def _env(
        self, secrets: dict[str, str] | None = None, extra: dict[str, str] | None = None
    ) -> dict[str, str]:
        return sandbox.build_env(
            home=self.paths.home,
            tmpdir=self.paths.tmp,
            allowlist=sandbox.DEFAULT_ENV_ALLOWLIST,
            secrets=secrets or {},
            extra={
                "EVALSITE_TRIAL_ID": str(self.trial.pk),
                **({"EVALSITE_SUITE_DIR": str(self.suite_dir)} if self.suite_dir else {}),
                **(extra or {}),
            },
        )

    def give_workspace_to_sandbox(self) -> None:
        """Files the worker wrote (oracle copies, prompt files) must belong to the sandbox uid."""
        if self.paths.uid is None:
            return
        for folder in (self.paths.workspace, self.paths.home):
            workspace.chown_tree(folder, self.paths.uid, self.paths.uid)

    def _save_artifact(self) -> str:
        data = workspace.make_artifact_tarball(self.paths.workspace, self._ignore_patterns())
        name = f"artifacts/run-{self.trial.run_id}/trial-{self.trial.pk}-attempt-{self.trial.attempt}.tar.gz"
        return default_storage.save(name, ContentFile(data))

    def cleanup(self) -> None:
        if self.root is not None and self.root.exists():
            try:
                workspace.cleanup(self.root)
            except Exception:
                logger.exception("could not remove sandbox %s", self.root)
                shutil.rmtree(self.root, ignore_errors=True)
        self.root = None

    def stop_heartbeat(self) -> None:
        self.heartbeat.stop()
        self.cleanup()

    def persist(self, outcome: Outcome, on_stored: OnStored | None = None) -> bool:
        """Write the trial's outcome in one transaction, only while it is still ours."""
        close_old_connections()
        usage = outcome.usage
        fields = {
            "status": outcome.status,
            "score": outcome.score,
            "finished_at": timezone.now(),
            "lease_expires_at": None,
            "setup_seconds": outcome.timings.get("setup"),
            "agent_seconds": outcome.timings.get("agent"),
            "grading_seconds": outcome.timings.get("grading"),
            "duration_seconds": outcome.timings.get("total"),
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "cache_read_tokens": usage.cache_read_tokens,
            "cache_creation_tokens": usage.cache_creation_tokens,
            "cost_usd": usage.cost_usd or 0.0,
            "turns": usage.turns,
            "role_usage": self.role_usage,
            "answerer_cost_usd": self.role_usage.get("answerer", {}).get("cost_usd", 0.0),
            "judge_cost_usd": self.role_usage.get("judge", {}).get("cost_usd", 0.0),
            "error_category": outcome.error_category,
            "error_message": redact(outcome.error_message, self.secret_values),
            "timed_out": outcome.timed_out,
            "budget_exceeded": outcome.budget_exceeded,
            "stopped_early": outcome.stopped_early,
            "visible_turns": outcome.visible_turns,
            "trajectory": outcome.trajectory,
            "agent_exit_code": outcome.exit_code,
            "agent_stdout": outcome.stdout,
            "agent_stderr": outcome.stderr,
            "diff": redact(outcome.diff, self.secret_values),
            "diff_truncated": outcome.diff_truncated,
            "artifact": outcome.artifact,
        }
        with transaction.atomic():
            stored = written.update(
                Trial, fields, "id = %s AND status = %s AND lease_owner = %s",
                [self.trial.pk, Trial.Status.RUNNING, self.worker],
            )  # fmt: skip
            if stored != 1:
                logger.warning("trial %s: lease lost before saving; another attempt owns it", self.trial.pk)
                return False
            # The last events land with the outcome, or not at all; their notice tells the pages.
            if not self.recorder.flush(fenced=True):
                live.publish(self.trial.run_id, self.trial.pk)
            rows = criterion_rows(self.trial.pk, outcome.criteria, self.secret_values)
            written.insert(CriterionResult, rows, CRITERION_FIELDS)
            if on_stored is not None:
                # The run's row last, held only while the outcome is counted: every trial of the
                # run that ends takes it, so with it taken first the outcome's own statements ran
                # in turn with every other trial's (256 in flight kept most of the worker's
                # connections waiting on it).
                # A recount (cancel, resume...) holds it too: before this outcome commits it
                # counted the trial as running and the count below starts from its result;
                # after, it counts the committed outcome. (Rows are taken trial, then run, as
                # resume's are.)
                run = written.fetch(Run, "id = %s", [self.trial.run_id], RUN_FIELDS, lock=True)[0]
                for name, value in fields.items():
                    setattr(self.trial, name, value)
                on_stored(run, self.trial, rows)
        if self.recorder.dropped:
            logger.info(
                "trial %s: %s events over the cap were not kept", self.trial.pk, self.recorder.dropped
            )
        return True


def judged(specs: list[dict]) -> bool:
    """Whether grading asks a model (an enabled llm_judge criterion)."""
    return any(spec.get("type") == "llm_judge" and spec.get("enabled", True) for spec in specs)


CRITERION_FIELDS = tuple(f.name for f in CriterionResult._meta.concrete_fields if not f.primary_key)


def criterion_rows(trial_id: int, results: list, secrets: list[str] = ()) -> list[CriterionResult]:
    """The stored rows of a trial's graded criteria (secrets redacted from their details)."""
    return [
        CriterionResult(
            trial_id=trial_id, index=c.index, type=c.type, description=c.description, score=c.score,
            passed=c.passed, weight=c.weight, pass_threshold=c.pass_threshold, gating=c.gating,
            details=redact(c.details, list(secrets)), error=c.error or "",
        )
        for c in results
    ]  # fmt: skip


VENV_DIRNAME = ".venv"  # coder-eval's name; artifacts leave it out


def sweep_sandboxes() -> int:
    """Remove the sandbox folders of trials no worker runs any more (a killed worker leaves its
    trials' folders behind), and of suites no worker holds: at worker start. Returns how many
    were removed."""
    root = Path(settings.TRIAL_ROOT)
    if not root.is_dir():
        return 0
    now = timezone.now()
    removed = 0
    for folder in root.glob("trial-*"):
        parts = folder.name.split("-")  # trial-<id>-a<attempt>-<token>
        live = (
            len(parts) == 4
            and parts[1].isdigit()
            and Trial.objects.filter(
                pk=int(parts[1]), attempt=int(parts[2][1:] or 0), status=Trial.Status.RUNNING,
                lease_expires_at__gt=now,
            ).exists()
        )  # fmt: skip
        if not live:
            workspace.cleanup(folder)
            removed += 1
    for folder in root.glob("suite-*"):  # a run's suite folder, while its holder renews the lease
        held = Run.objects.filter(
            suite_dir=str(folder / "workspace"), suite_lease_expires_at__gt=now
        ).exists()  # fmt: skip
        if not held:
            workspace.cleanup(folder)
            removed += 1
    return removed
