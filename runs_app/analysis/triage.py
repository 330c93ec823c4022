"""Failure triage, read from the trials: one unit's trials side by side across variants (where
their trajectories part), and a run's failures grouped by the criterion that failed and its
errors by message, with the labels people put on them."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from django.db.models import Count, Q
from django.db.models.functions import Substr

from runs_app.models import CriterionResult, Run, Trial, TrialEvent, TrialNote

# Tool calls shown per column of the unit view (the trial page has them all).
STEPS_SHOWN = 200
# Trials listed under each failure group (the group's count covers them all).
GROUP_TRIALS = 12


# --- one unit across variants --------------------------------------------------------------------


def step_of(event: TrialEvent) -> str:
    """A tool call as the comparison of trajectories sees it: its name and its input."""
    data = event.data or {}
    return f"{data.get('name', '?')} {json.dumps(data.get('input'), sort_keys=True, default=str)}"


def first_divergence(sequences: Sequence[Sequence[str]]) -> int | None:
    """The first position at which the sequences do not all agree (one ending counts), or None
    when they agree throughout, or there are fewer than two to compare."""
    if len(sequences) < 2:
        return None
    for position in range(max(len(sequence) for sequence in sequences)):
        steps = {sequence[position] if position < len(sequence) else None for sequence in sequences}
        if len(steps) > 1:
            return position
    return None


@dataclass
class Column:
    """One variant's trials of the unit, and the one shown in full."""

    variant: object
    trials: list[Trial]
    shown: Trial
    steps: list[str] = field(default_factory=list)
    criteria: list[CriterionResult] = field(default_factory=list)
    notes: list[TrialNote] = field(default_factory=list)


def unit_trials(run: Run, task_slug: str, row: str):
    """The unit's current trials in the run, in variant order, then by replicate."""
    return (
        Trial.objects.for_run(run)
        .current()
        .filter(task_version__task__slug=task_slug, dataset_row_id=row)
        .select_related("variant", "task_version__task")
        .order_by("variant__position", "variant_id", "replicate", "pk")
    )


def first_row(run: Run, task_slug: str) -> str:
    """The first dataset row of a task in the run ("" when it has none)."""
    rows = Trial.objects.for_run(run).filter(task_version__task__slug=task_slug).order_by("dataset_row_id")
    return rows.values_list("dataset_row_id", flat=True).first() or ""


def unit_columns(trials: Sequence[Trial], replicate: int | None = None) -> tuple[list[Column], int | None]:
    """A column per variant (its trial of `replicate` shown, else its first failed one, else its
    first), each with its tool calls, criteria and notes; and where the shown trials' tool calls
    first part (None: they agree, or only one variant ran)."""
    by_variant: dict[int, list[Trial]] = defaultdict(list)
    for trial in trials:
        by_variant[trial.variant_id].append(trial)
    columns = [Column(found[0].variant, found, _shown(found, replicate)) for found in by_variant.values()]
    shown = [column.shown.pk for column in columns]
    steps: dict[int, list[str]] = defaultdict(list)
    calls = TrialEvent.objects.filter(trial_id__in=shown, kind=TrialEvent.Kind.TOOL_CALL)
    for event in calls.order_by("trial_id", "seq"):
        steps[event.trial_id].append(step_of(event))
    criteria: dict[int, list[CriterionResult]] = defaultdict(list)
    for result in CriterionResult.objects.filter(trial_id__in=shown).order_by("trial_id", "index"):
        criteria[result.trial_id].append(result)
    notes = notes_by_trial([trial.pk for trial in trials])
    for column in columns:
        column.steps = steps[column.shown.pk]
        column.criteria = criteria[column.shown.pk]
        column.notes = notes.get(column.shown.pk, [])
    return columns, first_divergence([column.steps for column in columns])


def _shown(trials: list[Trial], replicate: int | None) -> Trial:
    for trial in trials:
        if trial.replicate == replicate:
            return trial
    return next((trial for trial in trials if trial.status in ("failed", "error")), trials[0])


def notes_by_trial(trial_ids: Sequence[int]) -> dict[int, list[TrialNote]]:
    found: dict[int, list[TrialNote]] = defaultdict(list)
    for note in TrialNote.objects.filter(trial_id__in=list(trial_ids)).select_related("author"):
        found[note.trial_id].append(note)
    return found


# --- a run's failures, grouped ---------------------------------------------------------------------


@dataclass
class Group:
    """Failed (or errored) trials sharing a failing criterion, or an error."""

    kind: str  # "criterion" or "error"
    title: str
    detail: str
    count: int
    by_variant: dict[str, int]
    trials: list[Trial]
    labels: list[tuple[str, int]] = field(default_factory=list)  # (label, notes), most first


def criterion_groups(run: Run) -> list[Group]:
    """The run's failed trials grouped by each gating criterion that failed (a trial failing two
    criteria is in both groups), most trials first."""
    failing = (
        CriterionResult.objects.filter(
            trial__run=run,
            trial__is_latest=True,
            trial__status=Trial.Status.FAILED,
            passed=False,
            gating=True,
        )  # fmt: skip
        .values("index", "type", "description")
        .annotate(n=Count("trial_id", distinct=True))
        .order_by("-n", "index", "type")
    )
    groups = []
    for row in failing:
        trials = (
            Trial.objects.for_run(run)
            .current()
            .filter(
                status=Trial.Status.FAILED,
                criterion_results__index=row["index"],
                criterion_results__type=row["type"],
                criterion_results__passed=False,
            )
        )
        title = f"#{row['index']} {row['type']}"
        groups.append(_group("criterion", title, row["description"], row["n"], trials))
    return groups


def error_groups(run: Run, chars: int) -> list[Group]:
    """The run's errored trials grouped by category and the first `chars` characters of the
    message (as the run page's error digest groups them), most trials first."""
    errored = Trial.objects.for_run(run).current().filter(status=Trial.Status.ERROR)
    rows = (
        errored.annotate(message=Substr("error_message", 1, chars))
        .values("error_category", "message")
        .annotate(n=Count("pk"))
        .order_by("-n", "error_category", "message")
    )
    groups = []
    for row in rows:
        trials = errored.annotate(message=Substr("error_message", 1, chars)).filter(
            error_category=row["error_category"], message=row["message"]
        )
        groups.append(_group("error", row["error_category"] or "error", row["message"], row["n"], trials))
    return groups


def _group(kind: str, title: str, detail: str, count: int, trials) -> Group:
    by_variant = dict(
        trials.values_list("variant__slug").annotate(n=Count("pk", distinct=True)).order_by("variant__slug")
    )
    ordered = trials.select_related("variant", "task_version__task").order_by("variant__position", "pk")
    listed = list(ordered[:GROUP_TRIALS])
    notes = TrialNote.objects.filter(Q(trial__in=trials.values("pk")), ~Q(label=""))
    labels = Counter(notes.values_list("label", flat=True)).most_common()
    return Group(kind, title, detail, count, by_variant, listed, labels)
