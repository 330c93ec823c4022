"""Grading an ended run's trials again with their tasks' current criteria (`manage.py evaluate`).

Each graded trial (passed, failed, or errored by its grader or judge) gets a new attempt holding the new
outcome; the old attempt is kept as history, as a retry keeps it. The workspace comes from the
trial's artifact (a run launched with keep_artifacts), the tool calls and final reply from its
stored trajectory. Nothing is written until every trial could be graded; then each trial's new
attempt is written in one transaction, and the run's counts, suites and gates are judged again.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from django.core.files.storage import default_storage
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from experiments_app.models import TaskVersion
from runs_app import control, launching
from runs_app.engine import regrade
from runs_app.engine.runner import Outcome, criterion_rows
from runs_app.models import CriterionResult, Run, Trial, TrialEvent

# Criteria that read only the agent's trajectory, not its workspace.
TRAJECTORY_ONLY = frozenset({"command_executed"})
GRADED = Q(status__in=[Trial.Status.PASSED, Trial.Status.FAILED]) | Q(
    status=Trial.Status.ERROR, error_category__in=["grader", "judge"]
)


class EvaluateRefused(Exception):
    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("; ".join(problems))


@dataclass
class Evaluation:
    changes: list[tuple[Trial, Trial]] = field(default_factory=list)  # (old attempt, new attempt)

    @property
    def changed(self) -> int:
        return sum(old.status != new.status for old, new in self.changes)


def evaluate_run(run: Run, by=control.COMMAND_LINE, task_slugs: list[str] | None = None) -> Evaluation:
    control.ensure_controllable(run, by)
    if not run.is_final:
        raise EvaluateRefused([f"run {run.pk} is {run.status}: evaluate re-grades a run that has ended"])
    trials = Trial.objects.for_run(run).current().filter(GRADED)
    if task_slugs:
        trials = trials.filter(task_version__task__slug__in=task_slugs)
    trials = list(trials.select_related("task_version__task", "variant", "run").order_by("pk"))
    latest = _latest_versions({t.task_version.task_id for t in trials})
    planned, problems = [], []
    for trial in trials:
        version = latest[trial.task_version.task_id]
        criteria = launching.current_criteria(trial, version)
        reads_workspace = sorted({c["type"] for c in criteria} - TRAJECTORY_ONLY)
        if reads_workspace and not trial.artifact:
            problems.append(
                f"{trial.label} kept no workspace (launch with keep_artifacts to re-grade it), and "
                f"its criteria {', '.join(reads_workspace)} read the workspace"
            )
        elif trial.trajectory is None and len(reads_workspace) < len({c["type"] for c in criteria}):
            problems.append(
                f"{trial.label} ran before trajectories were stored: command_executed cannot be re-graded"
            )
        planned.append((trial, criteria, version))
    if problems:
        more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        raise EvaluateRefused(problems[:10] + ([more.strip()] if more else []))
    evaluation = Evaluation()
    for trial, criteria, version in planned:
        artifact = _read(trial.artifact) if trial.artifact else None
        outcome, events = regrade.regrade(trial, criteria, artifact)
        new = _store(trial, outcome, events, criteria, version)
        if new is not None:
            evaluation.changes.append((trial, new))
    if evaluation.changes:
        control.rejudge_run(run.pk)
    return evaluation


def _latest_versions(task_ids: set[int]) -> dict[int, TaskVersion]:
    latest: dict[int, TaskVersion] = {}
    for version in TaskVersion.objects.filter(task_id__in=task_ids).select_related("task").order_by("number"):
        latest[version.task_id] = version
    return latest


def _read(name: str) -> bytes:
    with default_storage.open(name, "rb") as handle:
        return handle.read()


def _store(
    old: Trial, outcome: Outcome, events: list, criteria: list[dict], version: TaskVersion
) -> Trial | None:
    config = {**old.config, "success_criteria": criteria}
    with transaction.atomic():
        if not Trial.objects.select_for_update().filter(pk=old.pk, is_latest=True).exists():
            return None  # re-graded or retried meanwhile
        new = copy.copy(old)
        new._state = copy.copy(old._state)
        new._state.adding = True
        new.pk = None
        new.attempt, new.previous_attempt, new.is_latest = old.attempt + 1, old, True
        new.status, new.score = outcome.status, outcome.score
        new.error_category, new.error_message = outcome.error_category, outcome.error_message
        new.grading_seconds = outcome.timings.get("grading")
        new.config = config
        new.lineage = {**old.lineage, "success_criteria": f"evaluate (task version {version.number})"}
        new.config_fingerprint = launching.trial_fingerprint(old.task_version.bundle_id, config)
        new.finished_at = timezone.now()
        new.lease_owner, new.lease_expires_at, new.dispatched_at = "", None, None
        Trial.objects.filter(pk=old.pk).update(is_latest=False)
        new.save()
        kept = list(old.events.order_by("seq").values_list("at", "kind", "data"))
        note = {
            "text": f"re-graded by evaluate with the criteria of task version {version.number} "
            f"(attempt {old.attempt} was {old.status})"
        }
        now = timezone.now()
        rows = [*kept, (now, TrialEvent.Kind.SYSTEM, note), *((now, kind, data) for kind, data in events)]
        TrialEvent.objects.bulk_create(
            [
                TrialEvent(trial=new, seq=seq, at=at, kind=kind, data=data)
                for seq, (at, kind, data) in enumerate(rows, 1)
            ]
        )
        CriterionResult.objects.bulk_create(criterion_rows(new.pk, outcome.criteria))
    return new
