"""Per-unit tallies: each (run, variant, task version, dataset row)'s current trials summed in a
UnitTally row, so the comparison, the gates and the reports read a row per unit, not a row per
trial (a 100,000-trial run has a few thousand units).

Two ways keep them current, both under the run's row lock (or as the only writer: a launch,
an import), so two writers of one tally never interleave:
- `add_finished(run, trial, criteria)`: a running trial just got its outcome. Its values are
  added to its unit's tally and to the run's counts, in the transaction that stores the
  outcome: exactly once, and in time O(1) whatever the size of the run.
- `recount(run, trial_ids)`: after anything else changes a run's trials (cancel, retry, resume,
  the reaper, `evaluate`, a launch): the units of those trials (all of the run's when None)
  are regrouped from the trial table and the run recounted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import reduce
from operator import or_
from typing import Any

from django.db import connections, transaction
from django.db.models import Count, F, Max, Min, Q, Sum
from django.db.models.functions import Collate

from runs_app import written
from runs_app.analysis.stats.tally import AGENT_ERROR_CATEGORIES
from runs_app.models import CriterionResult, Run, Trial, UnitTally

UNIT_FIELDS = ("variant_id", "task_version_id", "dataset_row_id")


def recount(run: Run, trial_ids: Iterable[int] | None = None) -> int:
    """Regroup the units of `trial_ids` (every unit of the run when None) and recount the run.
    Returns what `Run.refresh_counts` returns."""
    with transaction.atomic():
        store(run, trial_ids)
        return run.refresh_counts()


def add_finished(run: Run, trial: Trial, criteria: Sequence[CriterionResult]) -> None:
    """Count a trial that went from running to its final state: its unit's tally and the run's
    counts. The caller stored the outcome in this transaction and holds the run's row lock."""
    if run.tallied:  # else it is rolled up whole when first read (see ensure)
        found = written.unit_tally(run.pk, trial.variant_id, trial.task_version_id, trial.dataset_row_id)
        if found is None:
            store(run, [trial.pk])
        else:
            _add(*found, trial, criteria)
    _count_finished(run, trial.status, note_components(run, trial.variant_id, trial.components))


def note_components(run: Run, variant_id: int, components: dict) -> bool:
    """Add a trial's components (`Trial.components`) to its run's summary, per variant: whether
    it holds a value the run had not seen (then the summary is written)."""
    seen = (run.components or {}).setdefault(str(variant_id), {})
    new = False
    for name, part in (components or {}).items():
        values = seen.setdefault(name, {})
        if part["fingerprint"] not in values:
            values[part["fingerprint"]] = part["value"]
            new = True
    if new:
        run.components = {**(run.components or {}), str(variant_id): seen}
    return new


# What one finished trial adds to its unit's tally (the other columns describe the unit).
ADDED_FIELDS = (
    "passed", "failed", "errors", "agent_errors", "cancelled", "tokens", "cost", "answerer_cost",
    "judge_cost", "score_sum", "score_n", "duration_sum", "duration_n", "tampered",
)  # fmt: skip


def _add(tally_id: int, counts: dict, trial: Trial, criteria: Sequence[CriterionResult]) -> None:
    """Add the trial's share of `grouped_trials` and `grouped_criteria` (same rules, one trial) to
    its tally row: one written-out UPDATE (the ORM's read and save cost 1.7 ms a trial)."""
    status = trial.status
    share = dict.fromkeys(ADDED_FIELDS, 0)
    share["passed"] = int(status == Trial.Status.PASSED)
    share["failed"] = int(status == Trial.Status.FAILED)
    share["errors"] = int(status == Trial.Status.ERROR)
    share["agent_errors"] = int(
        status == Trial.Status.ERROR and trial.error_category in AGENT_ERROR_CATEGORIES
    )
    share["cancelled"] = int(status == Trial.Status.CANCELLED)
    share["tampered"] = int(bool(trial.tampered))
    share["tokens"] = (
        trial.input_tokens + trial.output_tokens + trial.cache_read_tokens + trial.cache_creation_tokens
    )
    share["cost"] = trial.cost_usd or 0.0
    share["answerer_cost"] = trial.answerer_cost_usd or 0.0
    share["judge_cost"] = trial.judge_cost_usd or 0.0
    if status in (Trial.Status.PASSED, Trial.Status.FAILED):
        if trial.score is not None:
            share["score_sum"], share["score_n"] = trial.score, 1
        if trial.duration_seconds is not None:
            share["duration_sum"], share["duration_n"] = trial.duration_seconds, 1
        counts = dict(counts)
        for result in criteria:
            name = f"#{result.index + 1} {result.type}"
            passes, n = counts.get(name, (0, 0))
            counts[name] = [passes + bool(result.passed), n + 1]
    written.add_to_tally(tally_id, share, counts)


def _count_finished(run: Run, status: str, components_changed: bool = False) -> None:
    """The run's counts after one running trial ended: its outcome counted, and the running and
    queued ones counted again (a few rows of the index: at most the run's slots run at once)."""
    column = f"n_{Trial.Status(status)}"  # one of the run's count columns, never other text
    setattr(run, column, getattr(run, column) + 1)
    # Written out (`written`), as the claim is: the ORM spent a millisecond a trial on these two.
    run.n_running = written.running_trials(run.pk)
    run.n_queued = max(0, run.n_trials - run.n_done - run.n_running)
    run.tally_version += 1
    names = (
        column,
        "n_running",
        "n_queued",
        "tally_version",
        *(["components"] if components_changed else []),
    )
    counts = {name: getattr(run, name) for name in names}
    written.update(Run, counts, "id = %s", [run.pk])


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
        if units is None:
            _recount_components(run)
        complete = run.tallied or units is None
        Run.objects.filter(pk=run.pk).update(tallied=complete, tally_version=F("tally_version") + 1)
        run.tallied = complete
        run.tally_version = Run.objects.filter(pk=run.pk).values_list("tally_version", flat=True).get()


def _recount_components(run: Run) -> None:
    """The run's component summary afresh from its current trials (a whole recount only)."""
    run.components = {}
    rows = (
        Trial.objects.filter(run_id=run.pk)
        .current()
        .exclude(components={})
        .values_list("variant_id", "components")
    )
    for variant_id, components in rows.order_by().iterator():
        note_components(run, variant_id, components)
    Run.objects.filter(pk=run.pk).update(components=run.components)


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
        "answerer_cost": Sum("answerer_cost_usd"),
        "judge_cost": Sum("judge_cost_usd"),
        "first_trial_id": Min("pk"),
        "fingerprint_min": Min(fingerprint),
        "fingerprint_max": Max(fingerprint),
        "dataset_rows": Count("pk", filter=~Q(dataset_row_id="")),
        "tampered": Count("pk", filter=~Q(tampered="")),
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
        "answerer_cost": float(values["answerer_cost"] or 0.0),
        "judge_cost": float(values["judge_cost"] or 0.0),
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
