"""Suite thresholds for dataset tasks, evaluated once every row of a (task, variant) has run.

coder-eval's semantics: each criterion may set `suite_thresholds: {metric: minimum}`. Its
across-row aggregate offers `count`, `mean`, `median`, `std`, `min`, `max` of the per-row
scores and `completion_rate` (the share of rows with a usable result); a criterion whose results
carry labels (`classification_match`) adds `accuracy`, `macro_f1`, `weighted_f1`, `micro_f1` and
`precision.<label>`, `recall.<label>`, `f1.<label>`. The suite passes when every listed metric
is >= its minimum; a metric the aggregate does not offer fails. Rows whose trial produced no
result for the criterion, or whose result is an error, are left out (`rows_excluded`): errors
never count as fails.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


class ResultLike(Protocol):
    """What a stored criterion result must offer (a CriterionResult or a model row)."""

    score: float
    details: dict
    error: str | None


@dataclass
class ThresholdCheck:
    metric: str
    min_value: float
    actual_value: float | None
    passed: bool


@dataclass
class CriterionAggregate:
    index: int
    type: str
    description: str
    rows_total: int
    rows_excluded: int
    metrics: dict[str, float]
    threshold_checks: list[ThresholdCheck]
    passed: bool
    details: dict = field(default_factory=dict)
    error: str | None = None


@dataclass
class SuiteRollup:
    aggregates: list[CriterionAggregate]
    passed: bool


def score_metrics(scores: Sequence[float]) -> dict[str, float]:
    return {
        "count": float(len(scores)),
        "mean": statistics.fmean(scores),
        "median": float(statistics.median(scores)),
        "std": statistics.pstdev(scores) if len(scores) > 1 else 0.0,
        "min": float(min(scores)),
        "max": float(max(scores)),
    }


def _ratio(numerator: float, denominator: float) -> float:
    # coder-eval's convention: a zero denominator reads as 0.0.
    return numerator / denominator if denominator else 0.0


def _f1(precision: float, recall: float) -> float:
    return _ratio(2 * precision * recall, precision + recall)


def classification_metrics(pairs: Sequence[tuple[str, str]]) -> tuple[dict[str, float], dict]:
    """Accuracy, per-label precision/recall/F1, macro/weighted/micro F1 and the confusion counts
    over (expected, observed) label pairs."""
    labels = sorted({label for pair in pairs for label in pair})
    metrics: dict[str, float] = {}
    per_label: list[dict[str, Any]] = []
    tp_sum, fp_sum, fn_sum = 0, 0, 0
    for label in labels:
        tp = sum(1 for e, o in pairs if e == label and o == label)
        fp = sum(1 for e, o in pairs if e != label and o == label)
        fn = sum(1 for e, o in pairs if e == label and o != label)
        support = sum(1 for e, _ in pairs if e == label)
        precision, recall = _ratio(tp, tp + fp), _ratio(tp, tp + fn)
        f1 = _f1(precision, recall)
        metrics |= {f"precision.{label}": precision, f"recall.{label}": recall, f"f1.{label}": f1}
        per_label.append(
            {"label": label, "precision": precision, "recall": recall, "f1": f1, "support": support}
        )
        tp_sum, fp_sum, fn_sum = tp_sum + tp, fp_sum + fp, fn_sum + fn
    total_support = sum(row["support"] for row in per_label)
    metrics["accuracy"] = _ratio(sum(1 for e, o in pairs if e == o), len(pairs))
    metrics["macro_f1"] = sum(row["f1"] for row in per_label) / len(per_label)
    metrics["weighted_f1"] = _ratio(sum(row["f1"] * row["support"] for row in per_label), total_support)
    metrics["micro_f1"] = _f1(_ratio(tp_sum, tp_sum + fp_sum), _ratio(tp_sum, tp_sum + fn_sum))
    confusion = [{"expected": e, "observed": o, "count": n} for (e, o), n in sorted(Counter(pairs).items())]
    return metrics, {
        "labels": labels,
        "per_label": per_label,
        "confusion": confusion,
        "total_pairs": len(pairs),
    }


def aggregate_metrics(results: Sequence[ResultLike]) -> tuple[dict[str, float], dict]:
    """The metrics a criterion offers to `suite_thresholds`, from its per-row results."""
    metrics: dict[str, float] = score_metrics([r.score for r in results])
    details: dict[str, Any] = {}
    pairs = [
        (r.details["expected_label"], r.details["observed_label"])
        for r in results
        if isinstance(r.details, dict) and {"expected_label", "observed_label"} <= r.details.keys()
    ]
    if pairs:
        label_metrics, details = classification_metrics(pairs)
        metrics |= label_metrics
    return metrics, details


def check_suite_thresholds(
    thresholds: Mapping[str, float], metrics: Mapping[str, float]
) -> list[ThresholdCheck]:
    return [
        ThresholdCheck(name, minimum, metrics.get(name), name in metrics and metrics[name] >= minimum)
        for name, minimum in thresholds.items()
    ]


def _usable(row: Sequence[ResultLike] | None, index: int) -> ResultLike | None:
    result = row[index] if row is not None and index < len(row) else None
    return result if result is not None and not result.error else None


def criterion_aggregate(
    index: int, criterion: Mapping, rows: Sequence[Sequence[ResultLike] | None]
) -> CriterionAggregate:
    results = [r for r in (_usable(row, index) for row in rows) if r is not None]
    thresholds = criterion.get("suite_thresholds") or {}
    aggregate = CriterionAggregate(
        index=index,
        type=str(criterion.get("type", "")),
        description=str(criterion.get("description", "")),
        rows_total=len(rows),
        rows_excluded=len(rows) - len(results),
        metrics={},
        threshold_checks=[],
        passed=True,
    )
    if not results:
        aggregate.passed = not thresholds
        aggregate.error = "no row produced a usable result" if thresholds else None
        aggregate.threshold_checks = [ThresholdCheck(name, m, None, False) for name, m in thresholds.items()]
        return aggregate
    aggregate.metrics, aggregate.details = aggregate_metrics(results)
    # coder-eval's gateable share of rows with a usable result (`_attach_row_accounting`).
    aggregate.metrics["completion_rate"] = len(results) / len(rows)
    aggregate.threshold_checks = check_suite_thresholds(thresholds, aggregate.metrics)
    aggregate.passed = all(check.passed for check in aggregate.threshold_checks)
    return aggregate


def suite_rollup(criteria: Sequence[Mapping], rows: Sequence[Sequence[ResultLike] | None]) -> SuiteRollup:
    """Aggregate every criterion of one dataset task over its rows for one variant.

    `rows` holds, per trial (dataset row x replicate), its criterion results in criterion
    order, or None for a trial that produced none (errored before grading, cancelled).
    """
    aggregates = [criterion_aggregate(index, criterion, rows) for index, criterion in enumerate(criteria)]
    return SuiteRollup(aggregates, all(aggregate.passed for aggregate in aggregates))


def suite_passed(criteria: Sequence[Mapping], rows: Sequence[Sequence[ResultLike] | None]) -> bool:
    """True when every criterion's suite_thresholds hold (trivially, with none declared)."""
    return suite_rollup(criteria, rows).passed
