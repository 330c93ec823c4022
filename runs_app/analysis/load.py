"""What the comparison and the gates read from the database.

1. `load(runs)` runs four queries: the current trials grouped in SQL by (run, variant, task
   version, dataset row) with their counts and sums, the criterion results grouped the same
   way, then the task versions and the variants they name.
2. `analysis.compare.compare(data, baseline=…, tags=…)` computes everything else in Python.

`compare_runs(runs, …)` does both; `run_facts(run, suites)` is what the gates judge. A page
builds its form (baseline and tag choices) between the two steps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from django.db import connections
from django.db.models import Count, F, Max, Min, Q, Sum
from django.db.models.functions import Collate

from experiments_app.models import TaskVersion, Variant
from runs_app.analysis.compare import Arm, Cell, Comparison, ComparisonData, TaskInfo, Unit, compare
from runs_app.analysis.gates import RunFacts, VariantFacts, VersusFacts
from runs_app.analysis.tally import AGENT_ERROR_CATEGORIES
from runs_app.models import CriterionResult, Run, Trial

# --- loading ---------------------------------------------------------------------------------


def load(runs: Sequence[Run], *, criteria: bool = True) -> ComparisonData:
    """Read what a comparison of `runs` needs: four queries, whatever the number of trials
    (three without the per-criterion breakdown).

    Durations are summed per unit in the same GROUP BY: an exact median over 100,000 trials
    needs a second pass over them (a window function, or reading every duration), which
    costs SQLite 60-120 ms, more than the rest of the statistics together.
    """
    run_ids = [run.pk for run in runs]
    rows = _grouped_trials(run_ids)
    versions = {
        row["pk"]: row
        for row in TaskVersion.objects.filter(pk__in={row[2] for row in rows}).values(
            "pk", "task_id", "task__slug", "task__tags", "bundle_id"
        )
    }
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
    digests = {}
    units = set()
    for run_id, variant_id, version_id, row_id, cell in rows:
        task_id = versions[version_id]["task_id"]
        key = (arm_of[(run_id, variant_id)], task_id, row_id)
        # A run holds one version of each task; should one hold two, they are one task here.
        cells[key] = cells[key].merged(cell) if key in cells else cell
        digests[(run_id, task_id)] = versions[version_id]["bundle_id"]
        units.add(Unit(tasks[task_id], row_id))
    return ComparisonData(
        runs=list(runs),
        arms=arms,
        tasks=sorted(tasks.values(), key=lambda task: task.slug),
        units=sorted(units, key=lambda unit: (unit.task.slug, unit.task.task_id, unit.row)),
        cells=cells,
        digests=digests,
        default_baseline=_default_baseline(runs, arms, variants),
        criteria=_criteria(run_ids, arm_of, versions) if criteria else {},
    )


def _criteria(run_ids: list[int], arm_of: dict, versions: dict) -> dict:
    """(arm key, criterion) -> {(task id, row): (passes, n)} over graded current trials."""
    grouped = (
        CriterionResult.objects.filter(
            trial__run_id__in=run_ids,
            trial__status__in=[Trial.Status.PASSED, Trial.Status.FAILED],
            trial__is_latest=True,
        )
        .values("trial__run_id", "trial__variant_id", "trial__task_version_id", "trial__dataset_row_id")
        .annotate(n=Count("pk"), passes=Count("pk", filter=Q(passed=True)))
        .values_list(
            "trial__run_id",
            "trial__variant_id",
            "trial__task_version_id",
            "trial__dataset_row_id",
            "index",
            "type",
            "passes",
            "n",
        )
        .order_by()
    )
    found: dict[tuple[str, str], dict[tuple[int, str], tuple[int, int]]] = {}
    for run_id, variant_id, version_id, row_id, index, kind, passes, n in grouped:
        if (run_id, variant_id) not in arm_of or version_id not in versions:
            continue
        name = f"#{index + 1} {kind}"
        unit = (versions[version_id]["task_id"], row_id)
        counts = found.setdefault((arm_of[(run_id, variant_id)], name), {})
        before = counts.get(unit, (0, 0))
        counts[unit] = (before[0] + passes, before[1] + n)
    return found


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


def _grouped_trials(run_ids: list[int]) -> list[tuple[int, int, int, str, Cell]]:
    """(run id, variant id, task version id, dataset row id, Cell) for each group of current
    trials.

    The SQL is Django's, but rows come straight from the cursor: Django's per-value
    converters cost 45 ms on 10,000 groups of 16 aggregates, a third of the query itself.
    """
    if not run_ids:
        return []
    graded = Q(status__in=[Trial.Status.PASSED, Trial.Status.FAILED])
    database = Trial.objects.db
    # Hex digests compare the same under any collation; PostgreSQL's default (the locale's)
    # makes MIN/MAX over 100,000 of them cost 40 ms, "C" (bytewise) 15 ms. SQLite's is bytewise.
    fingerprint = (
        Collate("config_fingerprint", "C")
        if connections[database].vendor == "postgresql"
        else F("config_fingerprint")
    )
    aggregates = {
        "total": Count("pk"),
        "passed": Count("pk", filter=Q(status=Trial.Status.PASSED)),
        "failed": Count("pk", filter=Q(status=Trial.Status.FAILED)),
        "errors": Count("pk", filter=Q(status=Trial.Status.ERROR)),
        "agent_errors": Count(
            "pk", filter=Q(status=Trial.Status.ERROR, error_category__in=sorted(AGENT_ERROR_CATEGORIES))
        ),
        "cancelled": Count("pk", filter=Q(status=Trial.Status.CANCELLED)),
        "score_sum": Sum("score", filter=graded),
        "score_n": Count("score", filter=graded),
        "duration_sum": Sum("duration_seconds", filter=graded),
        "duration_n": Count("duration_seconds", filter=graded),
        "tokens": Sum(
            F("input_tokens") + F("output_tokens") + F("cache_read_tokens") + F("cache_creation_tokens")
        ),
        "cost": Sum("cost_usd"),
        "first_trial_id": Min("pk"),
        "fingerprint_min": Min(fingerprint),
        "fingerprint_max": Max(fingerprint),
        "dataset_rows": Count("pk", filter=~Q(dataset_row_id="")),
    }
    query = (
        # current() reads trial_comparison_idx in GROUP BY order and skips a sort (see its note).
        Trial.objects.filter(run_id__in=run_ids)
        .current()
        .values("run_id", "variant_id", "task_version_id", "dataset_row_id")
        .annotate(**aggregates)
        .order_by()  # Trial's default ordering would add pk to the GROUP BY
        .values_list("run_id", "variant_id", "task_version_id", "dataset_row_id", *aggregates)
    )
    sql, params = query.query.sql_with_params()
    with connections[database].cursor() as cursor:
        cursor.execute(sql, params)
        return [(*row[:4], _cell(dict(zip(aggregates, row[4:], strict=True)))) for row in cursor.fetchall()]


def _cell(values: dict[str, Any]) -> Cell:
    return Cell(
        passed=values["passed"],
        failed=values["failed"],
        errors=values["errors"],
        agent_errors=values["agent_errors"],
        cancelled=values["cancelled"],
        total=values["total"],
        score_sum=float(values["score_sum"] or 0.0),
        score_n=values["score_n"],
        duration_sum=float(values["duration_sum"] or 0.0),
        duration_n=values["duration_n"],
        # PostgreSQL sums bigints as numeric: Decimal, not int.
        tokens=int(values["tokens"] or 0),
        cost=float(values["cost"] or 0.0),
        first_trial_id=values["first_trial_id"],
        fingerprints=(values["fingerprint_min"] or "", values["fingerprint_max"] or ""),
        dataset_rows=values["dataset_rows"],
    )


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


# --- loading and comparing ------------------------------------------------------------------------


def compare_runs(runs: Sequence[Run], **options: Any) -> Comparison:
    """Load and compare in one call (command line, reports)."""
    return compare(load(runs), **options)


def run_facts(run: Run, suites: list[dict], clusterings: set[str] = frozenset()) -> RunFacts:
    """What the gates judge: the run's comparison (the numbers its pages show) per variant,
    and its dataset suites, also under each other clustering a gate names. Called once nothing
    is pending, just before the run is marked final."""
    data = load([run])
    clustered = {
        cluster: _facts(compare(data, final=True, cluster=cluster), suites) for cluster in clusterings
    }
    return dataclasses.replace(_facts(compare(data, final=True), suites), clustered=clustered)


def _facts(summary: Comparison, suites: list[dict]) -> RunFacts:
    facts = [_variant_facts(arm) for arm in summary.arms]
    overall = None
    if summary.overall is not None:
        overall = VariantFacts(
            "overall",
            passed=sum(arm.passed for arm in summary.arms),
            failed=sum(arm.failed for arm in summary.arms),
            error=sum(arm.errors for arm in summary.arms),
            agent_errors=sum(arm.agent_errors for arm in summary.arms),
            rate=summary.overall.estimate,
            low=summary.overall.low,
            high=summary.overall.high,
        )
    return RunFacts(facts, summary.baseline or None, list(suites), overall, summary.method)


def _variant_facts(arm) -> VariantFacts:
    versus = arm.versus
    return VariantFacts(
        arm.key,
        passed=arm.passed,
        failed=arm.failed,
        error=arm.errors,
        agent_errors=arm.agent_errors,
        rate=arm.pass_rate,
        low=arm.low,
        high=arm.high,
        versus=VersusFacts(
            clusters=versus.clusters,
            baseline_rate=versus.baseline_rate,
            arm_rate=versus.arm_rate,
            delta=versus.delta,
            low=versus.low,
            high=versus.high,
            p_adjusted=versus.p_holm,
            untested=versus.untested,
        )
        if versus
        else None,
    )
