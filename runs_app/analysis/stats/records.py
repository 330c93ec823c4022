"""The one shape of a comparison's figures wherever they leave the program: the API's run
`summary`, the comparison page's JSON and CSV downloads, report.json (`evalrun --report`,
`evalreport`) and the tables printed from it. One name per figure, the same everywhere;
docs/schema.md says what each field means (a test keeps it and this file in step).

Pure (no Django). `comparison_record` is the whole comparison, `arm_record` one arm's line (the
comparison's per-variant figures and, unless it is the baseline, its versus-the-baseline ones),
`csv_rows` the same lines flattened for a spreadsheet. Numbers that are not finite (a cost an
agent reported as NaN or infinity) leave as null: JSON has no NaN.
"""

from __future__ import annotations

import math
from typing import Any

from runs_app.analysis.stats import notes
from runs_app.analysis.stats.comparison import ArmSummary, BreakdownRow, Comparison, Versus

# Per-k figures: JSON objects keyed by k; in CSV one column each, `{name}_{k}`.
BY_K = ("pass_at_k", "pass_at_k_low", "pass_at_k_high", "pass_at_k_units", "pass_hat_k")


def comparison_record(comparison: Comparison) -> dict[str, Any]:
    """The comparison as JSON-ready data: its settings, every arm's line, the breakdowns and the
    warnings (trials are apart: `exports.trial_rows`)."""
    overall = comparison.overall
    return finite(
        {
            "runs": [
                {
                    "id": run.pk,
                    "status": run.status,
                    "fingerprint": run.fingerprint,
                    "gates": run.gate_results,
                }
                for run in comparison.runs
            ],
            "baseline": comparison.baseline or None,
            "baseline_problem": comparison.baseline_problem or None,
            "tags": comparison.tags,
            "cluster": comparison.cluster,
            "method": comparison.method,
            "repeats": comparison.repeats,
            "units": comparison.units,
            "tasks": len(comparison.rows),
            "confidence": comparison.confidence,
            "alpha": comparison.alpha,
            "final": comparison.final,
            "arms": [arm_record(arm, comparison) for arm in comparison.arms],
            "overall": (
                {
                    "pass_rate": overall.estimate,
                    "pass_rate_low": overall.low,
                    "pass_rate_high": overall.high,
                    "clusters": overall.clusters,
                }
                if overall
                else None
            ),
            "by_tag": [_breakdown(row, comparison) for row in comparison.by_tag],
            "by_criterion": [_breakdown(row, comparison) for row in comparison.by_criterion],
            "warnings": comparison.warnings,
            "quarantined": comparison.quarantined,
        }
    )


def arm_record(arm: ArmSummary, comparison: Comparison) -> dict[str, Any]:
    """One arm's figures; the versus-the-baseline fields are null for the baseline, and for an
    arm that shares no graded unit with it."""
    record: dict[str, Any] = {
        "arm": arm.key,
        "label": arm.label,
        "run": arm.run_id,
        "variant": arm.variant_slug,
        "baseline": arm.is_baseline,
        "trials": arm.trials,
        "passed": arm.passed,
        "failed": arm.failed,
        "errors": arm.errors,
        "agent_errors": arm.agent_errors,
        "infra_errors": arm.infra_errors,
        "cancelled": arm.cancelled,
        "pending": arm.pending,
        "tampered": arm.tampered,
        "units": arm.units,
        "clusters": arm.clusters,
        "pass_rate": arm.pass_rate,
        "pass_rate_low": arm.low,
        "pass_rate_high": arm.high,
        "interval": arm.interval,
        "pass_rate_if_errors_fail": arm.rate_if_errors_fail,
        "pass_rate_if_errors_fail_low": arm.rate_if_errors_fail_low,
        "pass_rate_if_errors_fail_high": arm.rate_if_errors_fail_high,
        "pass_rate_cs_low": arm.cs_low,
        "pass_rate_cs_high": arm.cs_high,
        "cs_units": arm.cs_units,
        "mean_score": arm.mean_score,
        "mean_score_low": arm.mean_score_low,
        "mean_score_high": arm.mean_score_high,
        "median_duration_seconds": arm.median_duration,
        "pass_at_k": arm.pass_at_k,
        "pass_at_k_low": arm.pass_at_k_low,
        "pass_at_k_high": arm.pass_at_k_high,
        "pass_at_k_units": arm.pass_at_k_units,
        "pass_hat_k": arm.pass_hat_k,
        "tokens": arm.tokens,
        "cost_usd": arm.cost,
        "mean_cost_usd": arm.mean_cost,
        "mean_cost_usd_low": arm.mean_cost_low,
        "mean_cost_usd_high": arm.mean_cost_high,
        "cost_per_pass_usd": arm.cost_per_pass,
        "cost_per_pass_usd_low": arm.cost_per_pass_low,
        "cost_per_pass_usd_high": arm.cost_per_pass_high,
        "answerer_cost_usd": arm.answerer_cost,
        "judge_cost_usd": arm.judge_cost,
        "flaky": arm.flaky,
        "not_comparable": arm.not_comparable,
    }
    record.update(_versus_fields(arm.versus))
    record["anytime"] = notes.anytime_words(arm, comparison.baseline_label, comparison.confidence)
    return record


def _versus_fields(versus: Versus | None) -> dict[str, Any]:
    fields: dict[str, Any] = dict.fromkeys(VERSUS_FIELDS)
    fields["improved"], fields["regressed"] = [], []
    if versus is None:
        return fields
    fields.update(
        {
            "paired_units": versus.units,
            "paired_clusters": versus.clusters,
            "baseline_rate_paired": versus.baseline_rate,
            "rate_paired": versus.arm_rate,
            "delta": versus.delta,
            "delta_low": versus.low,
            "delta_high": versus.high,
            "detectable_delta": versus.mde,
            "test": versus.test,
            "p_value": versus.p_value,
            "p_holm": versus.p_holm,
            "untested_because": versus.untested or None,
            "significant": versus.significant if versus.p_holm is not None else None,
            "depends_on_errors": versus.depends_on_errors,
            "delta_if_errors_fail": versus.delta_if_errors_fail,
            "delta_if_errors_fail_low": versus.delta_if_errors_fail_low,
            "delta_if_errors_fail_high": versus.delta_if_errors_fail_high,
            "delta_if_errors_pass": versus.delta_if_errors_pass,
            "delta_if_errors_pass_low": versus.delta_if_errors_pass_low,
            "delta_if_errors_pass_high": versus.delta_if_errors_pass_high,
            "delta_cs_low": versus.cs_low,
            "delta_cs_high": versus.cs_high,
            "delta_cs_units": versus.cs_units,
            "decided": versus.decided or None,
            "baseline_error_share": versus.baseline_error_share,
            "error_share": versus.arm_error_share,
            "infra_error_p": versus.error_p,
            "errors_differ": versus.errors_differ,
            "delta_cost_usd": versus.cost_delta,
            "delta_cost_usd_low": versus.cost_delta_low,
            "delta_cost_usd_high": versus.cost_delta_high,
            "delta_cost_per_pass_usd": versus.cost_per_pass_delta,
            "delta_cost_per_pass_usd_low": versus.cost_per_pass_delta_low,
            "delta_cost_per_pass_usd_high": versus.cost_per_pass_delta_high,
            "improved": [change.unit for change in versus.improved],
            "regressed": [change.unit for change in versus.regressed],
            "improved_by_chance": versus.improved_by_chance,
            "regressed_by_chance": versus.regressed_by_chance,
        }
    )
    return fields


# The versus-the-baseline fields of an arm's record, in order.
VERSUS_FIELDS = (
    "paired_units", "paired_clusters", "baseline_rate_paired", "rate_paired", "delta", "delta_low",
    "delta_high", "detectable_delta", "test", "p_value", "p_holm", "untested_because", "significant",
    "depends_on_errors", "delta_if_errors_fail", "delta_if_errors_fail_low", "delta_if_errors_fail_high",
    "delta_if_errors_pass", "delta_if_errors_pass_low", "delta_if_errors_pass_high", "delta_cs_low",
    "delta_cs_high", "delta_cs_units", "decided", "baseline_error_share", "error_share", "infra_error_p",
    "errors_differ", "delta_cost_usd", "delta_cost_usd_low", "delta_cost_usd_high",
    "delta_cost_per_pass_usd", "delta_cost_per_pass_usd_low", "delta_cost_per_pass_usd_high",
    "improved", "regressed", "improved_by_chance", "regressed_by_chance",
)  # fmt: skip


def csv_rows(comparison: Comparison) -> list[dict[str, Any]]:
    """Every arm's record flattened for CSV: a per-k figure becomes one column per k
    (`pass_at_k_3`), a list one cell of its items joined by "; "."""
    top = comparison.max_k
    rows = []
    for record in comparison_record(comparison)["arms"]:
        row: dict[str, Any] = {}
        for name, value in record.items():
            if name in BY_K:
                row.update({f"{name}_{k}": value.get(str(k), value.get(k)) for k in range(1, top + 1)})
            elif isinstance(value, list):
                row[name] = "; ".join(map(str, value))
            else:
                row[name] = value
        rows.append(row)
    return rows


def _breakdown(row: BreakdownRow, comparison: Comparison) -> dict[str, Any]:
    return {
        "name": row.name,
        "arms": {
            arm.key: (
                {
                    "pass_rate": cell.estimate,
                    "pass_rate_low": cell.low,
                    "pass_rate_high": cell.high,
                    "clusters": cell.clusters,
                }
                if cell
                else None
            )  # fmt: skip
            for arm, cell in zip(comparison.arms, row.cells, strict=True)
        },
    }


def finite(value: Any) -> Any:
    """`value` with every float that is not finite replaced by None, through dicts and lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value
