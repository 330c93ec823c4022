"""What the comparison and the gates read from the database.

1. `load(runs)` runs four queries: the runs' unit tallies (the current trials summed per
   (run, variant, task version, dataset row) with each criterion's passes, kept by `rollup`),
   then the task versions, the quarantines in force among their tasks (left out), and the
   variants they name.
2. `analysis.compare.compare(data, baseline=…, tags=…)` computes everything else in Python.

`compare_runs(runs, …)` does both; `run_facts(run, suites)` is what the gates judge. A page
builds its form (baseline and tag choices) between the two steps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from django.db.models import Avg, Case, Count, F, FloatField, Q, When
from django.db.models.functions import Cast

from evalsite.db import give_back_connection
from evalsite.keyed_locks import Recent
from experiments_app.models import Quarantine, TaskVersion, Variant
from runs_app.analysis import rollup
from runs_app.analysis.stats.compare import compare
from runs_app.analysis.stats.comparison import Arm, Cell, Comparison, ComparisonData, TaskInfo, Unit
from runs_app.analysis.stats.gates import RunFacts, facts_of
from runs_app.models import Run, UnitTally

# --- loading ---------------------------------------------------------------------------------


def load(runs: Sequence[Run], *, criteria: bool = True) -> ComparisonData:
    """Read what a comparison of `runs` needs from their unit tallies (see `rollup`): four
    queries, whatever the number of trials; a 100,000-trial run is a few thousand rows. Tasks
    quarantined as broken are left out here, and listed (`_without_quarantined`).

    Durations are summed per unit: an exact median over 100,000 trials would need every
    duration read again, more than the rest of the statistics together.
    """
    rollup.ensure(runs)
    rows = _tally_rows([run.pk for run in runs], criteria)
    versions = {
        row["pk"]: row
        for row in TaskVersion.objects.filter(pk__in={row[2] for row in rows}).values(
            "pk", "task_id", "task__slug", "task__tags", "bundle_id"
        )
    }
    rows, versions, quarantined = _without_quarantined(rows, versions)
    variants = {
        row["pk"]: row
        for row in Variant.objects.filter(pk__in={row[1] for row in rows}).values("pk", "slug", "position")
    }
    arms = _arms(runs, rows, variants)
    arm_of = {(arm.run_id, arm.variant_id): arm.key for arm in arms}
    tasks = {
        v["task_id"]: TaskInfo(v["task_id"], v["task__slug"], tuple(v["task__tags"] or ()))
        for v in versions.values()
    }
    cells: dict[tuple[str, int, str], Cell] = {}
    found: dict[tuple[str, str], dict[tuple[int, str], tuple[int, int]]] = {}
    digests = {}
    units = set()
    for run_id, variant_id, version_id, row_id, cell, by_criterion in rows:
        task_id = versions[version_id]["task_id"]
        arm = arm_of[(run_id, variant_id)]
        key = (arm, task_id, row_id)
        # A run holds one version of each task; should one hold two, they are one task here.
        cells[key] = cells[key].merged(cell) if key in cells else cell
        digests[(run_id, task_id)] = versions[version_id]["bundle_id"]
        units.add(Unit(tasks[task_id], row_id))
        for name, (passes, n) in by_criterion.items():
            counts = found.setdefault((arm, name), {})
            before = counts.get((task_id, row_id), (0, 0))
            counts[(task_id, row_id)] = (before[0] + passes, before[1] + n)
    return ComparisonData(
        runs=list(runs),
        arms=arms,
        tasks=sorted(tasks.values(), key=lambda task: task.slug),
        units=sorted(units, key=lambda unit: (unit.task.slug, unit.task.task_id, unit.row)),
        cells=cells,
        digests=digests,
        default_baseline=_default_baseline(runs, arms, variants),
        criteria=found,
        components={
            (run.pk, int(variant_id)): parts
            for run in runs
            for variant_id, parts in (run.components or {}).items()
        },
        quarantined=quarantined,
        missing_baseline=_missing_baseline(runs, arms),
    )


def _without_quarantined(
    rows: list[tuple], versions: dict[int, dict]
) -> tuple[list[tuple], dict, list[dict]]:
    """The one place a quarantined task leaves the numbers: its tallies and versions are dropped
    before any figure is computed (rates, intervals, Δ, gates, reports, charts), and it is listed
    with its reason. (Quarantining bumps the runs' tally versions, so no comparison outlives it.)"""
    present = {version["task_id"] for version in versions.values()}
    active = Quarantine.objects.active().filter(task_id__in=present).select_related("task", "created_by")
    found = {quarantine.task_id: quarantine for quarantine in active}
    if not found:
        return rows, versions, []
    kept = [row for row in rows if versions[row[2]]["task_id"] not in found]
    kept_versions = {pk: version for pk, version in versions.items() if version["task_id"] not in found}
    listed = [
        {
            "task": quarantine.task.slug,
            "reason": quarantine.reason,
            "by": quarantine.created_by.get_username() if quarantine.created_by else "",
            "since": quarantine.created_at.isoformat(),
        }
        for quarantine in sorted(found.values(), key=lambda q: q.task.slug)
    ]
    return kept, kept_versions, listed


def _arms(runs: Sequence[Run], rows: list[tuple], variants: dict[int, dict]) -> list[Arm]:
    present = {(row[0], row[1]) for row in rows}
    several = len(runs) > 1
    arms = []
    for run in runs:
        ids = sorted(
            (variant_id for run_id, variant_id in present if run_id == run.pk),
            key=lambda pk: (variants[pk]["position"], pk),
        )
        for variant_id in ids:
            slug = variants[variant_id]["slug"]
            key = f"{slug}@{run.pk}" if several else slug
            label = f"{slug} · run #{run.pk}" if several else slug
            arms.append(Arm(key, label, run.pk, variant_id, slug))
    return arms


CELL_FIELDS = (
    "passed", "failed", "errors", "agent_errors", "cancelled", "total", "score_sum", "score_n",
    "duration_sum", "duration_n", "tokens", "cost", "first_trial_id",
)  # fmt: skip


def _tally_rows(run_ids: list[int], criteria: bool) -> list[tuple[int, int, int, str, Cell, dict]]:
    """(run id, variant id, task version id, dataset row id, Cell, criteria) per unit tally."""
    fields = ("run_id", "variant_id", "task_version_id", "dataset_row_id", *CELL_FIELDS,
              "fingerprint_min", "fingerprint_max", "dataset_rows", "answerer_cost",
              "judge_cost", "tampered")  # fmt: skip
    query = UnitTally.objects.filter(run_id__in=run_ids).order_by()
    if criteria:
        fields = (*fields, "criteria")
    rows = []
    for row in query.values_list(*fields):
        # Positional: CELL_FIELDS are Cell's first fields, in order (a dict per row cost 1 s a
        # million rows).
        cell = Cell(
            *row[4:17], fingerprints=(row[17], row[18]), dataset_rows=row[19], answerer_cost=row[20],
            judge_cost=row[21], tampered=row[22],
        )  # fmt: skip
        rows.append((*row[:4], cell, row[23] if criteria else {}))
    return rows


def _default_baseline(runs: Sequence[Run], arms: list[Arm], variants: dict[int, dict]) -> str | None:
    """The first run's frozen baseline, else the experiment's, else the first arm."""
    if not arms:
        return None
    first = runs[0]
    slug = (first.config or {}).get("baseline")
    if slug is None and first.experiment.baseline_id in variants:
        slug = variants[first.experiment.baseline_id]["slug"]
    matches = [arm.key for arm in arms if arm.run_id == first.pk and arm.variant_slug == slug]
    return matches[0] if matches else arms[0].key


def _missing_baseline(runs: Sequence[Run], arms: list[Arm]) -> str:
    """The baseline the first run was launched with, when it has no trial to compare with."""
    if not runs:
        return ""
    slug = (runs[0].config or {}).get("baseline")
    present = any(arm.run_id == runs[0].pk and arm.variant_slug == slug for arm in arms)
    return slug if slug and not present else ""


# --- loading and comparing ------------------------------------------------------------------------

# A comparison is a pure function of the runs' tallies (and the tasks' tags, the experiment's
# baseline): computed once per tally version and kept a minute in this process, so a hundred
# viewers of one run, or reloads of a 100k-trial comparison (a second of statistics), cost one.
MEMO_SECONDS = 60.0
_memo = Recent(MEMO_SECONDS, size=16, before_wait=give_back_connection)


def _state(runs: Sequence[Run]) -> tuple:
    return tuple((run.pk, run.tally_version, run.status, run.experiment.baseline_id) for run in runs)


def loaded(runs: Sequence[Run], *, criteria: bool = True) -> ComparisonData:
    """`load(runs)`, computed once per state of the runs (see MEMO_SECONDS)."""
    rollup.ensure(runs)
    return _memo.get(("load", _state(runs), criteria), lambda: load(runs, criteria=criteria))


def comparison(runs: Sequence[Run], *, criteria: bool = True, **options: Any) -> Comparison:
    """`compare(load(runs), **options)`, computed once per state of the runs and options."""
    rollup.ensure(runs)
    key = ("compare", _state(runs), criteria, tuple(sorted((k, repr(v)) for k, v in options.items())))
    return _memo.get(key, lambda: compare(loaded(runs, criteria=criteria), **options))


def forget_comparisons() -> None:
    _memo.clear()


def compare_runs(runs: Sequence[Run], **options: Any) -> Comparison:
    """Load and compare in one call (command line, reports)."""
    return compare(load(runs), **options)


def run_facts(run: Run, suites: list[dict], clusterings: set[str] = frozenset()) -> RunFacts:
    """What the gates judge: the run's comparison (the numbers its pages show) per variant,
    and its dataset suites, also under each other clustering a gate names. Called once nothing
    is pending, just before the run is marked final."""
    data = load([run])
    clustered = {
        cluster: facts_of(compare(data, final=True, cluster=cluster), suites) for cluster in clusterings
    }
    return dataclasses.replace(facts_of(compare(data, final=True), suites), clustered=clustered)


def variant_rates(run_ids: Sequence[int]) -> dict[int, list[tuple[str, float | None, int]]]:
    """Each run's variants with the comparison's pass rate, for the lists (one query over the
    tallies): the mean over units of each unit's passed / (passed + failed + agent errors),
    the rule and the estimate of `compare` (`analysis.stats.tally`), never a rate pooled over
    trials or variants. (variant, rate or None when no unit was graded, graded units)."""
    graded_trials = F("passed") + F("failed") + F("agent_errors")
    rows = (
        UnitTally.objects.filter(run_id__in=list(run_ids))
        .values("run_id", "variant__slug", "variant__position")
        .annotate(
            rate=Avg(
                Case(
                    When(Q(passed__gt=0) | Q(failed__gt=0) | Q(agent_errors__gt=0),
                         then=Cast("passed", FloatField()) / Cast(graded_trials, FloatField())),
                    output_field=FloatField(),
                )
            ),
            units=Count("pk", filter=Q(passed__gt=0) | Q(failed__gt=0) | Q(agent_errors__gt=0)),
        )
        .order_by("run_id", "variant__position", "variant__slug")
    )  # fmt: skip
    found: dict[int, list[tuple[str, float | None, int]]] = {run_id: [] for run_id in run_ids}
    for row in rows:
        found[row["run_id"]].append((row["variant__slug"], row["rate"], row["units"]))
    return found
