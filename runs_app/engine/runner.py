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
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, transaction
from django.utils import timezone

from evalsite.db import persistently
from evalsite.versioning import code_version
from experiments_app.models import TaskVersion
from runs_app import live, written
from runs_app.engine import criteria, grading, identity, integrity
from runs_app.engine.agent_phase import AgentPhase
from runs_app.engine.context import TrialContext, stopped
from runs_app.engine.leases import Heartbeat
from runs_app.engine.outcome import Outcome, TrialAborted, step_failure
from runs_app.engine.recording import Recorder, redact
from runs_app.engine.sandbox import Phase, SandboxError, WorkspaceError, workspace
from runs_app.engine.trial_sandbox import TrialSandbox
from runs_app.engine.usage import stored_cost
from runs_app.models import CriterionResult, Run, Trial, TrialEvent

logger = logging.getLogger(__name__)

OnStored = Callable[[Run, Trial, list[CriterionResult]], None]


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
        # Written out (`written`): every trial takes it, and the ORM spent ~2 ms of a trivial
        # trial's CPU composing these two statements.
        claimed = written.update(
            Trial, running, written.claimable(),
            [trial_id, Trial.Status.QUEUED, code_version(), Run.Suite.READY, settings.WORKER_HOST],
        ) == 1  # fmt: skip
        if claimed:
            written.count_claimed(trial_id)
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
        try:
            outcome = execution.run()
        except Exception as exc:
            if isinstance(exc, OperationalError | InterfaceError) and not execution.agent_started:
                # The database went away before the agent ran: nothing was spent, so the trial
                # goes back to the queue as it was (not an error, no attempt counted).
                logger.warning("trial %s: no database during its setup (%s); queued again", trial_id, exc)
                execution.box.cleanup()
                persistently(
                    execution.give_back, seconds=settings.TRIAL_REPORT_SECONDS, what=f"trial {trial_id}"
                )
                return None, trial.run_id
            # The harness itself failed: never a "failed" trial.
            logger.exception("trial %s crashed in the harness", trial_id)
            outcome = Outcome(Trial.Status.ERROR, "harness", f"{type(exc).__name__}: {exc}")
        execution.box.cleanup()
        # Reported while the lease keeper still renews the trial's lease: a database outage
        # that outlasts the lease does not hand a trial that ran to another worker.
        stored = persistently(
            lambda: execution.persist(outcome, on_stored),
            seconds=settings.TRIAL_REPORT_SECONDS,
            what=f"trial {trial_id}'s outcome",
        )
    finally:
        execution.stop_heartbeat()
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
    """One claimed trial from setup to its stored outcome: the phases in order, on the trial's
    sandbox (`TrialSandbox`), with its agent (`AgentPhase`) and its grading (`grading`)."""

    def __init__(self, trial: Trial, worker: str):
        self.trial = trial
        self.worker = worker
        self.heartbeat = Heartbeat(trial, worker)
        secret_values: list[str] = []
        recorder = Recorder(
            trial.pk,
            secret_values,
            first_attempt=trial.attempt == 1,
            run_id=trial.run_id,
            lease=self.heartbeat,
        )
        self.context = TrialContext(trial, trial.config, recorder, self.heartbeat, secret_values)
        self.recorder = recorder
        self.config: dict = trial.config
        self.box = TrialSandbox(trial, trial.config, self.context.stop_reason)
        self.agent_process_seconds = 0.0
        self.components: dict = {}
        self.agent_started = False  # from then on the trial has cost something: never run twice

    # --- the phases ---------------------------------------------------------------------------

    def run(self) -> Outcome:
        self.heartbeat.start()
        timings: dict[str, float] = {}
        started = time.perf_counter()
        # Not written at once: the claim showed the trial running, and a trial's first write
        # cost a transaction of its own. A setup that takes a while is written while its
        # commands run (`TrialContext.stop_reason`), a quick one with what follows.
        self.recorder.phase("setup", worker=self.worker, attempt=self.trial.attempt)
        try:
            self.setup()
        except (TrialAborted, WorkspaceError, SandboxError) as exc:
            category = exc.category if isinstance(exc, TrialAborted) else "setup"
            outcome = self._stopped_or(Outcome(Trial.Status.ERROR, category, str(exc)))
            return self._ended(outcome, timings, started)
        timings["setup"] = time.perf_counter() - started
        if reason := self.heartbeat.stop_reason():
            return self._ended(stopped(reason), timings, started)
        outcome = self._after_setup(timings)
        return self._ended(self._after_hooks(outcome), timings, started)

    def setup(self) -> None:
        try:
            self.box.open(experiment_of(self.trial.run_id))
        finally:
            self._record_image()
        self.box.apply_template_sources()
        self.box.write_cli_recorders()
        self.box.provide_environment()
        self.recorder.phase("pre_run")
        run_steps(self.box, self.context, "pre_run", fatal=True)

    def _record_image(self) -> None:
        """A container trial's image: what building (or finding) it printed, in the transcript."""
        build = self.box.image_build
        if build.command:
            self.recorder.add(
                TrialEvent.Kind.OUTPUT,
                {
                    "step": "image",
                    "command": build.command,
                    "exit_code": 1 if build.error else 0,
                    "stdout": "\n".join(build.lines)[-8000:],
                    "stderr": build.error,
                    "timed_out": False,
                },
            )

    def _after_setup(self, timings: dict[str, float]) -> Outcome:
        """The before hooks, the agent and the grading; `hooks.trial.after` follows whatever
        this returns."""
        if self._hooks("before"):
            self.recorder.phase("hooks_before")
        if failure := self._run_hooks("before", stop_at_first=True):
            return self._stopped_or(Outcome(Trial.Status.ERROR, "hook", failure))
        before = self.box.snapshot()
        protected = self._protected()
        agent_started = time.perf_counter()
        # Written with what follows, or while the agent runs (its first poll, within a second):
        # not in a transaction of its own, as for the setup.
        self.recorder.phase("agent", kind=self.context.agent_kind())
        self.agent_started = True
        result = AgentPhase(self.box, self.context).run()
        outcome = result.outcome
        self.agent_process_seconds = result.process_seconds
        timings["agent"] = time.perf_counter() - agent_started
        after = self.box.snapshot()
        outcome.diff, outcome.diff_truncated = workspace_diff(before, after)
        if outcome.status in (Trial.Status.ERROR, Trial.Status.CANCELLED):
            return outcome
        if protected is not None and (changed := integrity.changes(protected, self._protected() or {})):
            outcome.tampered = redact(tamper_report(changed, before, after), self.context.secret_values)

        grading_started = time.perf_counter()
        # What was spent so far is stored before a model is asked to grade (a long call).
        self.recorder.phase("grading", flush=grading.judged(self.config.get("success_criteria") or []))
        grading.grade(self.box, self.context, result.trace, outcome)
        timings["grading"] = time.perf_counter() - grading_started
        if self.heartbeat.stop_reason():
            # A cancel kills a criterion's command as it runs, which would read as a fail.
            return self._stopped_or(outcome)
        if outcome.tampered:
            # Graded all the same (the criteria are shown), but a changed test proves nothing.
            self.recorder.add(TrialEvent.Kind.SYSTEM, {"text": "protected paths changed: the trial fails"})
            outcome.status, outcome.error_category, outcome.error_message = Trial.Status.FAILED, "", ""
        self.recorder.phase("post_run")
        run_steps(self.box, self.context, "post_run", fatal=False)
        return outcome

    def _protected(self) -> dict[str, str] | None:
        """The digests of the task's protected paths (`integrity.protected`), if it has any."""
        patterns = (self.config.get("integrity") or {}).get("protected")
        return integrity.digests(self.box.workspace, list(patterns)) if patterns else None

    def _hooks(self, which: str) -> list[dict]:
        return ((self.config.get("hooks") or {}).get("trial") or {}).get(which) or []

    def _run_hooks(self, which: str, stop_at_first: bool) -> str:
        """Run `hooks.trial.<which>` in the sandbox; what failed, in words ("" when none did)."""
        failures = []
        for index, hook in enumerate(self._hooks(which)):
            result = self.box.run_command(hook["command"], float(hook.get("timeout", 60)), Phase.HOOK)
            if failure := record_step(self.context, f"hooks.trial.{which}[{index}]", hook["command"], result):
                failures.append(failure)
                if stop_at_first or self.heartbeat.stop_reason():
                    break
        return "; ".join(failures)

    def _stopped_or(self, outcome: Outcome) -> Outcome:
        """A step that failed because the run was cancelled (or the lease lost) killed it: the
        trial ends as stopped, not as that step's error, so `resume` runs it again."""
        reason = self.heartbeat.stop_reason()
        if reason is None:
            return outcome
        ended = stopped(reason)
        outcome.status, outcome.error_category = ended.status, ended.error_category
        outcome.error_message = ended.error_message
        # Not graded then: `resume` runs the same trial again, and grades it then.
        outcome.criteria, outcome.score = [], None
        return outcome

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
        return self._stopped_or(outcome)

    def _ended(self, outcome: Outcome, timings: dict[str, float], started: float) -> Outcome:
        timings["total"] = time.perf_counter() - started
        self.components = identity.trial_components(
            self.config,
            self.context.agent_kind(),
            self.config.get("agent") or {},
            self.box.environment_components(),
        )
        if self.box.over_disk and not outcome.budget_exceeded:
            outcome.budget_exceeded = "disk"  # whichever phase reached the cap
        outcome.timings = timings
        if self.box.image is not None:
            outcome.image_digest = self.box.image.digest
        if self.trial.run.keep_artifacts and self.box.box is not None:
            outcome.artifact = self.box.save_artifact()
        self.box.cleanup()
        self.recorder.phase(
            "finished",
            status=outcome.status,
            error=outcome.error_message[:500],
            seconds=round(timings["total"], 4),
            agent_process_seconds=round(self.agent_process_seconds, 4),
        )
        return outcome

    def stop_heartbeat(self) -> None:
        self.heartbeat.stop()
        self.box.cleanup()

    def give_back(self) -> bool:
        """Put the trial back in the queue as it was claimed (same attempt), if it is still ours."""
        with transaction.atomic():
            queued = {"status": Trial.Status.QUEUED, "lease_owner": "", "lease_expires_at": None,
                      "dispatched_at": None, "started_at": None, "host": ""}  # fmt: skip
            given = written.update(
                Trial, queued, "id = %s AND status = %s AND lease_owner = %s",
                [self.trial.pk, Trial.Status.RUNNING, self.worker],
            ) == 1  # fmt: skip
            if given:
                written.count_given_back(self.trial.pk)
                live.publish(self.trial.run_id, self.trial.pk)
        return given

    def persist(self, outcome: Outcome, on_stored: OnStored | None = None) -> bool:
        """Write the trial's outcome in one transaction, only while it is still ours."""
        close_old_connections()
        usage = outcome.usage
        role_usage, secret_values = self.context.role_usage, self.context.secret_values
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
            "cost_usd": stored_cost(usage.cost_usd),
            "turns": usage.turns,
            "role_usage": role_usage,
            "answerer_cost_usd": stored_cost(role_usage.get("answerer", {}).get("cost_usd")),
            "judge_cost_usd": stored_cost(role_usage.get("judge", {}).get("cost_usd")),
            "error_category": outcome.error_category,
            "error_message": redact(outcome.error_message, secret_values),
            "timed_out": outcome.timed_out,
            "budget_exceeded": outcome.budget_exceeded,
            "stopped_early": outcome.stopped_early,
            "tampered": outcome.tampered,
            "image_digest": outcome.image_digest,
            "visible_turns": outcome.visible_turns,
            "trajectory": outcome.trajectory,
            "agent_exit_code": outcome.exit_code,
            "agent_stdout": outcome.stdout,
            "agent_stderr": outcome.stderr,
            "diff": redact(outcome.diff, secret_values),
            "diff_truncated": outcome.diff_truncated,
            "artifact": outcome.artifact,
            "components": self.components,
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
            rows = criterion_rows(self.trial.pk, outcome.criteria, secret_values)
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


def run_steps(box: TrialSandbox, context: TrialContext, name: str, *, fatal: bool) -> None:
    """The task's `pre_run` or `post_run` commands, each recorded; with `fatal`, a failing one
    (unless `fail_on_error: false`) ends the trial as an error of that step."""
    phase = Phase.PRE_RUN if name == "pre_run" else Phase.POST_RUN
    for index, step in enumerate(context.config.get(name) or []):
        result = box.run_command(step["command"], float(step.get("timeout", 30)), phase)
        failure = record_step(context, f"{name}[{index}]", step["command"], result)
        if failure and fatal and step.get("fail_on_error", True):
            raise TrialAborted(name, failure)


def record_step(context: TrialContext, step: str, command: str, result: criteria.CommandOutcome) -> str:
    """Record a step's output; what went wrong, in words ("" when it succeeded)."""
    context.recorder.add(
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
    # What it printed, in the order a reader expects: a step that says why on stdout (`echo`)
    # is as clear as one that says it on stderr.
    output = "\n".join(part.strip() for part in (result.stdout, result.stderr) if part.strip())
    return step_failure(step, command, result.exit_code, result.timed_out, output)


def tamper_report(changed: list[str], before: dict, after: dict) -> str:
    """What changed of the protected paths, then their diff."""
    paths = {line.split(" ", 1)[1] for line in changed}
    diff, _ = workspace_diff(
        {path: content for path, content in before.items() if path in paths},
        {path: content for path, content in after.items() if path in paths},
    )
    return "\n".join(changed) + ("\n\n" + diff if diff else "")


def workspace_diff(before: dict, after: dict) -> tuple[str, bool]:
    return workspace.unified_diff(before, after, settings.DIFF_CAP_BYTES)


CRITERION_FIELDS = tuple(f.name for f in CriterionResult._meta.concrete_fields if not f.primary_key)


def criterion_rows(trial_id: int, results: list, secrets: Sequence[str] = ()) -> list[CriterionResult]:
    """The stored rows of a trial's graded criteria (secrets redacted from their details)."""
    return [
        CriterionResult(
            trial_id=trial_id, index=c.index, type=c.type, description=c.description, score=c.score,
            passed=c.passed, weight=c.weight, pass_threshold=c.pass_threshold, gating=c.gating,
            details=redact(c.details, list(secrets)), error=c.error or "",
        )
        for c in results
    ]  # fmt: skip
