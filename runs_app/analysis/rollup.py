"""Per-unit tallies: each (run, variant, task version, dataset row)'s current trials summed in a
UnitTally row, so the comparison, the gates and the reports read a row per unit, not a row per
trial (a 100,000-trial run has a few thousand units).

`recount(run, trial_ids)` is the one call after anything changes a run's trials: it regroups
the units of those trials (all of the run's when None) from the trial table, replaces their
tally rows and recounts the run. Callers hold the run's row lock, or are the only writer (a
launch, an import), so two regroupings of one unit never interleave.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import reduce
from operator import or_
from typing import Any

from django.db import connections, transaction
from django.db.models import Count, F, Max, Min, Q, Sum
from django.db.models.functions import Collate

from runs_app.analysis.tally import AGENT_ERROR_CATEGORIES
from runs_app.models import CriterionResult, Run, Trial, UnitTally

UNIT_FIELDS = ("variant_id", "task_version_id", "dataset_row_id")


def recount(run: Run, trial_ids: Iterable[int] | None = None) -> int:
    """Regroup the units of `trial_ids` (every unit of the run when None) and recount the run.
    Returns what `Run.refresh_counts` returns."""
    with transaction.atomic():
        store(run, trial_ids)
        return run.refresh_counts()


def ensure(runs: Sequence[Run]) -> None:
    """Roll up the runs that have trials but no tallies yet (made before tallies existed)."""
    for run in runs:
        if not run.tallied:
            with transaction.atomic():
                locked = Run.objects.select_for_update().get(pk=run.pk)
                if not locked.tallied:
                    store(locked, None)
            run.tallied = True


def store(run: Run, trial_ids: Iterable[int] | None) -> None:
    """Replace the tally rows of the units `trial_ids` belong to (all of the run's when None)."""
    trials = Trial.objects.filter(run_id=run.pk)
    if trial_ids is None:
        units = None
        scope = Q()
    else:
        units = set(Trial.objects.filter(pk__in=list(trial_ids), run_id=run.pk).values_list(*UNIT_FIELDS))
        if not units:
            return
        scope = reduce(or_, (Q(**dict(zip(UNIT_FIELDS, unit, strict=True))) for unit in units))
    groups = grouped_trials(trials.filter(scope))
    criteria = grouped_criteria(run.pk, scope)
    with transaction.atomic():
        UnitTally.objects.filter(run_id=run.pk).filter(scope).delete()
        UnitTally.objects.bulk_create(
            [
                UnitTally(
                    run_id=run.pk,
                    **dict(zip(UNIT_FIELDS, unit, strict=True)),
                    **values,
                    criteria=criteria.get(unit, {}),
                )  # fmt: skip
                for unit, values in groups.items()
            ],
            batch_size=1000,
        )
        if units is None and not run.tallied:
            Run.objects.filter(pk=run.pk).update(tallied=True)
            run.tallied = True


def grouped_trials(trials) -> dict[tuple[int, int, str], dict[str, Any]]:
    """(variant id, task version id, dataset row id) -> the summed current trials of that unit.

    The SQL is Django's, but rows come straight from the cursor: Django's per-value
    converters cost 45 ms on 10,000 groups of 16 aggregates, a third of the query itself."""
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
        trials.current()
        .values(*UNIT_FIELDS)
        .annotate(**aggregates)
        .order_by()  # Trial's default ordering would add pk to the GROUP BY
        .values_list(*UNIT_FIELDS, *aggregates)
    )
    sql, params = query.query.sql_with_params()
    with connections[database].cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return {tuple(row[:3]): _values(dict(zip(aggregates, row[3:], strict=True))) for row in rows}


def _values(values: dict[str, Any]) -> dict[str, Any]:
    return {
        **values,
        "score_sum": float(values["score_sum"] or 0.0),
        "duration_sum": float(values["duration_sum"] or 0.0),
        # PostgreSQL sums bigints as numeric: Decimal, not int.
        "tokens": int(values["tokens"] or 0),
        "cost": float(values["cost"] or 0.0),
        "fingerprint_min": values["fingerprint_min"] or "",
        "fingerprint_max": values["fingerprint_max"] or "",
    }


def grouped_criteria(run_id: int, scope: Q) -> dict[tuple[int, int, str], dict[str, list[int]]]:
    """unit -> {"#i type": [passes, n]} over the unit's graded current trials."""
    rows = (
        CriterionResult.objects.filter(
            trial__run_id=run_id,
            trial__status__in=[Trial.Status.PASSED, Trial.Status.FAILED],
            trial__is_latest=True,
        )
        .filter(_on_trial(scope))
        .values(*(f"trial__{field}" for field in UNIT_FIELDS))
        .annotate(n=Count("pk"), passes=Count("pk", filter=Q(passed=True)))
        .values_list(*(f"trial__{field}" for field in UNIT_FIELDS), "index", "type", "passes", "n")
        .order_by()
    )
    found: dict[tuple[int, int, str], dict[str, list[int]]] = {}
    for variant_id, version_id, row_id, index, kind, passes, n in rows:
        found.setdefault((variant_id, version_id, row_id), {})[f"#{index + 1} {kind}"] = [passes, n]
    return found


def _on_trial(scope: Q) -> Q:
    """The same unit filter, seen from a criterion result (through its trial)."""
    if not scope.children:
        return Q()
    moved = Q(*(_on_trial(child) if isinstance(child, Q) else (f"trial__{child[0]}", child[1])
                for child in scope.children))  # fmt: skip
    moved.connector, moved.negated = scope.connector, scope.negated
    return moved
