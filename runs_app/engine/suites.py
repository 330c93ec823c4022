"""Dataset suite thresholds, evaluated when a run ends (per dataset task and variant)."""

from collections import defaultdict
from dataclasses import asdict

from runs_app.engine.criteria import suite_rollup
from runs_app.models import CriterionResult, Run, Trial


class _Stored:
    """A stored CriterionResult seen through the grader's ResultLike protocol."""

    def __init__(self, row: CriterionResult):
        self.score, self.details, self.error = row.score, row.details, row.error or None


def evaluate_suites(run: Run) -> list[dict]:
    """One entry per (dataset task, variant) whose criteria declare suite_thresholds."""
    trials = (
        Trial.objects.for_run(run)
        .current()
        .exclude(dataset_row_id="")
        .select_related("variant", "task_version__task")
        .prefetch_related("criterion_results")
        .order_by("pk")
    )
    groups: dict[tuple[int, int], list[Trial]] = defaultdict(list)
    for trial in trials:
        groups[(trial.task_version_id, trial.variant_id)].append(trial)
    results = []
    for members in groups.values():
        first = members[0]
        # The criteria the trials ran with (a variant may replace the task's; an imported run
        # carries coder-eval's resolved ones).
        criteria = (first.config or {}).get("success_criteria") or first.task_version.spec.get(
            "success_criteria", []
        )
        if not any(c.get("suite_thresholds") for c in criteria):
            continue
        rows = [[_Stored(r) for r in t.criterion_results.all()] or None for t in members]
        rollup = suite_rollup(criteria, rows)
        results.append(
            {
                "task": first.task_version.task.slug,
                "variant": first.variant.slug,
                "passed": rollup.passed,
                "criteria": [asdict(aggregate) for aggregate in rollup.aggregates],
            }
        )
    return results
