"""What the comparison and the gates read from the database.

1. `load(runs)` runs three queries: the current trials grouped in SQL by (run, variant, task
   version) with their counts and sums, then the task versions and the variants they name.
2. `analysis.compare.compare(data, baseline=…, tags=…)` computes everything else in Python.

`compare_runs(runs, …)` does both; `run_facts(run, suites)` is what the gates judge. A page
builds its form (baseline and tag choices) between the two steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connections
from django.db.models import Count, F, Max, Min, Q, Sum
from django.db.models.functions import Collate

from experiments_app.models import TaskVersion, Variant
from runs_app.analysis.compare import SUMMED, Arm, Cell, Comparison, ComparisonData, TaskInfo, compare
from runs_app.analysis.gates import RunFacts, VariantFacts
from runs_app.models import Run, Trial

# --- loading ---------------------------------------------------------------------------------


def load(runs: Sequence[Run]) -> ComparisonData:
    """Read what a comparison of `runs` needs: three queries, whatever the number of trials.

    Durations are summed per task in the same GROUP BY: an exact median over 100,000 trials
    needs a second pass over them (a window function, or reading every duration), which
    costs SQLite 60-120 ms, more than the rest of the statistics together.
    """
    rows = _grouped_trials([run.pk for run in runs])
    versions = {
        row["pk"]: row
        for row in TaskVersion.objects.filter(pk__in={version_id for _, _, version_id, _ in rows}).values(
            "pk", "task_id", "task__slug", "task__tags", "bundle_id"
        )
    }
    variants = {
        row["pk"]: row
        for row in Variant.objects.filter(pk__in={variant_id for _, variant_id, _, _ in rows}).values(
            "pk", "slug", "position"
        )
    }
    arms = _arms(runs, rows, variants)
    arm_of = {(arm.run_id, arm.variant_id): arm.key for arm in arms}
    cells = {}
    digests = {}
    for run_id, variant_id, version_id, cell in rows:
        task_id = versions[version_id]["task_id"]
        key = (arm_of[(run_id, variant_id)], task_id)
        # A run holds one version of each task; should one hold two, they are one task here.
        cells[key] = _merged(cells[key], cell) if key in cells else cell
        digests[(run_id, task_id)] = versions[version_id]["bundle_id"]
    tasks = sorted(
        {TaskInfo(v["task_id"], v["task__slug"], tuple(v["task__tags"] or ())) for v in versions.values()},
        key=lambda task: task.slug,
    )
    return ComparisonData(
        runs=list(runs),
        arms=arms,
        tasks=tasks,
        cells=cells,
        digests=digests,
        default_baseline=_default_baseline(runs, arms, variants),
    )


def _arms(runs: Sequence[Run], rows: list[tuple], variants: dict[int, dict]) -> list[Arm]:
    present = {(run_id, variant_id) for run_id, variant_id, _, _ in rows}
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


def _grouped_trials(run_ids: list[int]) -> list[tuple[int, int, int, Cell]]:
    """(run id, variant id, task version id, Cell) for each group of current trials.

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
        .values("run_id", "variant_id", "task_version_id")
        .annotate(**aggregates)
        .order_by()  # Trial's default ordering would add pk to the GROUP BY
        .values_list("run_id", "variant_id", "task_version_id", *aggregates)
    )
    sql, params = query.query.sql_with_params()
    with connections[database].cursor() as cursor:
        cursor.execute(sql, params)
        return [(*row[:3], _cell(dict(zip(aggregates, row[3:], strict=True)))) for row in cursor.fetchall()]


def _cell(values: dict[str, Any]) -> Cell:
    return Cell(
        passed=values["passed"],
        failed=values["failed"],
        errors=values["errors"],
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


def _merged(first: Cell, second: Cell) -> Cell:
    return Cell(
        **{name: getattr(first, name) + getattr(second, name) for name in SUMMED},
        first_trial_id=min(first.first_trial_id, second.first_trial_id),
        fingerprints=(
            min(first.fingerprints[0], second.fingerprints[0]),
            max(first.fingerprints[1], second.fingerprints[1]),
        ),
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


def run_facts(run: Run, suites: list[dict]) -> RunFacts:
    """What the gates judge: counts and the comparison with the baseline, per variant, and the
    run's dataset suites."""
    summary = compare_runs([run])
    facts = []
    for arm in summary.arms:
        versus = arm.versus if arm.versus and arm.versus.tasks else None
        facts.append(
            VariantFacts(
                arm.key,
                arm.passed,
                arm.failed,
                arm.errors,
                delta=versus.delta if versus else None,
                p_adjusted=versus.p_holm if versus else None,
            )  # fmt: skip
        )
    return RunFacts(facts, summary.baseline or None, list(suites))
