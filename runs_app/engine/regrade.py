"""Grading a finished trial again (`manage.py evaluate`): the workspace it left (its artifact),
the trajectory its criteria read, and other criteria, in a fresh sandbox (no agent runs).

The trial's `post_run` commands run after grading, as coder-eval's `evaluate` runs them.
"""

from __future__ import annotations

import io
import tarfile
import time
from pathlib import Path

from runs_app.engine import grading
from runs_app.engine.context import TrialContext
from runs_app.engine.grading import AgentTrace
from runs_app.engine.outcome import Outcome, TrialAborted
from runs_app.engine.runner import experiment_of, run_steps
from runs_app.engine.sandbox import SandboxError, WorkspaceError, environments
from runs_app.engine.trial_sandbox import TrialSandbox
from runs_app.models import Trial

WORKER = "evaluate"


class KeptEvents:
    """The events of a re-grade (post_run output), kept for the new attempt: none is written to
    the graded trial."""

    dropped = 0

    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []

    def add(self, kind: str, data: dict) -> None:
        self.events.append((kind, data))

    def phase(self, name: str, flush: bool = False, **data: object) -> None:
        self.add("phase", {"phase": name, **data})

    def flush(self) -> None:
        pass

    def flush_if_due(self) -> None:
        pass


def regrade(
    trial: Trial, success_criteria: list[dict], artifact: bytes | None
) -> tuple[Outcome, list[tuple[str, dict]]]:
    """The outcome of grading `trial` (whose run ended) with `success_criteria`, and the events
    of doing so; nothing is saved."""
    config = {**trial.config, "success_criteria": success_criteria}
    kept = KeptEvents()
    context = TrialContext(trial, config, kept, heartbeat=None)
    box = TrialSandbox(trial, config, lambda: None)
    started = time.perf_counter()
    outcome = Outcome(Trial.Status.RUNNING, stopped_early=trial.stopped_early)
    try:
        box.open(experiment_of(trial.run_id), purpose="regrade")
        if artifact is not None:
            restore_workspace(artifact, box.paths.workspace)
        box.provide_environment()
        box.give_workspace_to_sandbox()  # an image's folder: the artifact is copied in...
        box.pull_workspace()  # ...and what the file criteria read is the folder as it now is
        trajectory = trial.trajectory or {}
        trace = AgentTrace(
            tool_calls=trajectory.get("tool_calls", []),
            final_text=trajectory.get("final_text", ""),
            dialog=trajectory.get("dialog", []),
        )
        grading.grade(box, context, trace, outcome)
        run_steps(box, context, "post_run", fatal=False)
    except (TrialAborted, WorkspaceError, SandboxError, environments.InstallError) as exc:
        outcome.status, outcome.error_category, outcome.error_message = Trial.Status.ERROR, "setup", str(exc)
    finally:
        box.cleanup()
    outcome.timings = {"grading": time.perf_counter() - started}
    return outcome, kept.events


def restore_workspace(artifact: bytes, target: Path) -> None:
    """Unpack an artifact (`workspace/...` entries) into `target`. Entries tar's data filter
    refuses (absolute paths, links leading out, devices) are left out, as the agent could write them."""

    def keep(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
        if member.name == "workspace" or not member.name.startswith("workspace/"):
            return None
        member = member.replace(name=member.name.removeprefix("workspace/"), deep=False)
        if member.islnk():
            member = member.replace(linkname=member.linkname.removeprefix("workspace/"), deep=False)
        try:
            return tarfile.data_filter(member, path)
        except tarfile.FilterError:
            return None

    try:
        with tarfile.open(fileobj=io.BytesIO(artifact), mode="r:gz") as tar:
            tar.extractall(target, filter=keep)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise WorkspaceError(f"the trial's artifact cannot be unpacked: {exc}") from None
