"""What a comparison computes from the loaded data: pure Python, no Django, no queries.

Used by the comparison pages, the command line, the reports, the API and the gates. An arm is
one variant of one run; across several runs the same variant in two runs is two arms ("fast@12"
and "fast@15"), so a new run compares against an old one. Tasks pair across arms by Task, not
by version: a task that changed between runs still pairs, and a warning names it.

`analysis.load.load` reads a `ComparisonData`; `compare` turns it into a `Comparison`: per-arm
statistics, each arm against the baseline, the heat-map rows and the warnings. Outcomes are
counted by the one rule of `analysis.tally`.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from runs_app.analysis import stats
from runs_app.analysis.bootstrap import CONFIDENCE, ITERATIONS, PassCount, task_bootstrap
from runs_app.analysis.tally import pass_rate


class Run(Protocol):
    """What a comparison reads of a run (`runs_app.models.Run` has it)."""

    pk: int
    status: str
    fingerprint: str
    gate_results: list

    @property
    def is_final(self) -> bool: ...


# Below this many paired tasks a bootstrap interval is too narrow to trust (stats docstring).
FEW_TASKS = 10
# Warnings list this many task names, then "and N more".
LISTED = 10

# Cell fields that add up when two cells merge.
SUMMED = ("passed", "failed", "errors", "cancelled", "total", "score_sum", "score_n")
SUMMED += ("duration_sum", "duration_n", "tokens", "cost", "dataset_rows")
# Summary CSV column -> Versus attribute.
VERSUS_COLUMNS = {
    "paired_tasks": "tasks",
    "delta": "delta",
    "delta_low": "low",
    "delta_high": "high",
    "test": "test",
    "p_value": "p_value",
    "p_holm": "p_holm",
}


@dataclass
class Cell:
    """The current trials of one task in one arm."""

    passed: int = 0
    failed: int = 0
    errors: int = 0
    cancelled: int = 0
    total: int = 0
    score_sum: float = 0.0
    score_n: int = 0
    duration_sum: float = 0.0
    duration_n: int = 0
    tokens: int = 0
    cost: float = 0.0
    first_trial_id: int | None = None
    # Smallest and largest config fingerprint: equal when every trial ran the same config.
    fingerprints: tuple[str, str] = ("", "")
    dataset_rows: int = 0

    @property
    def n(self) -> int:
        """Graded trials: the denominator of the pass rate."""
        return self.passed + self.failed

    @property
    def rate(self) -> float | None:
        return pass_rate(self.passed, self.failed)

    @property
    def pending(self) -> int:
        return self.total - self.n - self.errors - self.cancelled

    @property
    def mean_duration(self) -> float | None:
        return self.duration_sum / self.duration_n if self.duration_n else None


@dataclass(frozen=True)
class Arm:
    """One variant of one run."""

    key: str  # the URL value: the variant slug, or "slug@run" across several runs
    label: str
    run_id: int
    variant_id: int
    variant_slug: str


@dataclass(frozen=True)
class TaskInfo:
    task_id: int
    slug: str
    tags: tuple[str, ...]


@dataclass
class ComparisonData:
    """What `load` read from the database; `compare` needs nothing else."""

    runs: list[Run]
    arms: list[Arm]
    tasks: list[TaskInfo]  # sorted by slug
    cells: dict[tuple[str, int], Cell]  # (arm key, task id)
    digests: dict[tuple[int, int], str]  # (run id, task id) -> task bundle digest
    default_baseline: str | None

    @property
    def tags(self) -> list[str]:
        return sorted({tag for task in self.tasks for tag in task.tags})


@dataclass
class TaskDelta:
    slug: str
    baseline: str  # "k/n"
    variant: str
    delta: float


@dataclass
class Versus:
    """An arm against the baseline, over the tasks both graded."""

    tasks: int
    delta: float
    low: float
    high: float
    p_value: float
    test: str  # "McNemar exact" or "paired bootstrap"
    p_holm: float = 1.0
    improved: list[TaskDelta] = field(default_factory=list)
    regressed: list[TaskDelta] = field(default_factory=list)


@dataclass
class ArmSummary:
    key: str
    label: str
    run_id: int
    variant_slug: str
    is_baseline: bool
    trials: int
    passed: int
    failed: int
    errors: int
    cancelled: int
    pending: int
    pass_rate: float | None
    low: float | None
    high: float | None
    interval: str  # "Wilson" or "cluster bootstrap"
    mean_score: float | None
    # The median over tasks of each task's mean graded-trial duration: every task weighs the
    # same, as in the rest of the comparison; with one repeat it is the median trial duration.
    median_duration: float | None
    pass_at_k: dict[int, float]
    pass_hat_k: dict[int, float]
    tokens: int
    cost: float
    cost_per_pass: float | None
    flaky: list[str]
    not_comparable: list[str]
    versus: Versus | None = None

    @property
    def mean_cost(self) -> float | None:
        """Cost per finished trial, whatever its outcome (errors and cancellations cost too)."""
        finished = self.trials - self.pending
        return self.cost / finished if finished else None


@dataclass
class HeatRow:
    task: TaskInfo
    cells: list[Cell | None]  # one per arm, in the arms' order


@dataclass
class Comparison:
    runs: list[Run]
    arms: list[ArmSummary]
    baseline: str
    tags: list[str]
    repeats: int  # most trials of one task in one arm; 1 selects the one-repeat methods
    iterations: int
    seed: int
    confidence: float
    rows: list[HeatRow]
    warnings: list[str]

    @property
    def baseline_arm(self) -> ArmSummary:
        return next(arm for arm in self.arms if arm.key == self.baseline)

    @property
    def others(self) -> list[ArmSummary]:
        return [arm for arm in self.arms if not arm.is_baseline]

    @property
    def max_k(self) -> int:
        return max((max(arm.pass_at_k, default=0) for arm in self.arms), default=0)

    def to_dict(self) -> dict[str, Any]:
        """The summary as JSON-ready data (no per-task matrix: see `trial_rows` for trials)."""
        return {
            "runs": [
                {
                    "id": run.pk,
                    "status": run.status,
                    "fingerprint": run.fingerprint,
                    "gates": run.gate_results,
                }
                for run in self.runs
            ],
            "baseline": self.baseline,
            "tags": self.tags,
            "repeats": self.repeats,
            "tasks": len(self.rows),
            "confidence": self.confidence,
            "bootstrap": {"iterations": self.iterations, "seed": self.seed},
            "arms": [asdict(arm) for arm in self.arms],
            "warnings": self.warnings,
        }

    def summary_rows(self) -> list[dict[str, Any]]:
        """One flat row per arm (the summary CSV)."""
        rows = []
        for arm in self.arms:
            row = {
                "arm": arm.key,
                "run": arm.run_id,
                "variant": arm.variant_slug,
                "baseline": arm.is_baseline,
                "trials": arm.trials,
                "passed": arm.passed,
                "failed": arm.failed,
                "errors": arm.errors,
                "cancelled": arm.cancelled,
                "pending": arm.pending,
                "pass_rate": arm.pass_rate,
                "pass_rate_low": arm.low,
                "pass_rate_high": arm.high,
                "interval": arm.interval,
                "mean_score": arm.mean_score,
                "median_duration_s": arm.median_duration,
                "tokens": arm.tokens,
                "cost_usd": arm.cost,
                "cost_per_pass_usd": arm.cost_per_pass,
            }
            for k in range(1, self.max_k + 1):
                row[f"pass@{k}"] = arm.pass_at_k.get(k)
                row[f"pass^{k}"] = arm.pass_hat_k.get(k)
            versus = arm.versus
            row.update({column: getattr(versus, name, None) for column, name in VERSUS_COLUMNS.items()})
            row["improved"] = len(versus.improved) if versus else None
            row["regressed"] = len(versus.regressed) if versus else None
            row["flaky"] = len(arm.flaky)
            rows.append(row)
        return rows


# --- statistics -------------------------------------------------------------------------------


def compare(
    data: ComparisonData,
    *,
    baseline: str | None = None,
    tags: Iterable[str] = (),
    iterations: int = ITERATIONS,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> Comparison:
    """Per-arm statistics, each arm against the baseline, the heat-map and the warnings.

    1. Keep the tasks carrying any of `tags` (all tasks when none).
    2. repeats = the most trials of one task in one arm. With one repeat: Wilson intervals,
       McNemar's exact test and Newcombe's paired interval. With more: one bootstrap over tasks
       for every arm at once (`task_bootstrap`), pass@k and pass^k for k = 1 … the fewest
       graded trials of a task in that arm.
    3. Holm-adjust the p-values of every arm that shares a graded task with the baseline.
    """
    keys = [arm.key for arm in data.arms]
    baseline = baseline or data.default_baseline
    if data.arms and baseline not in keys:
        raise ValueError(f"unknown baseline {baseline!r}: choose one of {', '.join(keys)}")
    wanted = set(tags)
    tasks = [task for task in data.tasks if not wanted or wanted & set(task.tags)]
    matrix = [[data.cells.get((key, task.task_id)) for key in keys] for task in tasks]
    repeats = max((cell.total for row in matrix for cell in row if cell), default=0)
    counts = [[(cell.passed, cell.n) if cell else (0, 0) for cell in row] for row in matrix]
    base = keys.index(baseline) if data.arms else 0
    intervals, paired = _intervals(counts, len(keys), base, repeats, iterations, seed, confidence)
    arms = [_summary(arm, i, tasks, matrix, counts, intervals[i], repeats) for i, arm in enumerate(data.arms)]
    for i, arm in enumerate(arms):
        arm.is_baseline = i == base
        if i != base:
            arm.versus = _versus(tasks, counts, base, i, repeats, paired[i])
    _holm(arms)
    return Comparison(
        runs=data.runs,
        arms=arms,
        baseline=baseline or "",
        tags=sorted(wanted),
        repeats=repeats,
        iterations=iterations,
        seed=seed,
        confidence=confidence,
        rows=[HeatRow(task, row) for task, row in zip(tasks, matrix, strict=True)],
        warnings=_warnings(data, arms, tasks, repeats),
    )


def _intervals(counts, arms: int, base: int, repeats: int, iterations: int, seed: int, confidence: float):
    """Per-arm pass rate intervals, and per-arm paired bootstrap results (repeats only)."""
    if repeats > 1:
        return task_bootstrap(counts, base, iterations=iterations, confidence=confidence, seed=seed)
    wilson = []
    for i in range(arms):
        passes = sum(row[i][0] for row in counts)
        n = sum(row[i][1] for row in counts)
        wilson.append(stats.wilson_interval(passes, n, confidence) if n else None)
    return wilson, [None] * arms


def _summary(arm: Arm, i: int, tasks, matrix, counts, interval, repeats: int) -> ArmSummary:
    present = [(task, row[i]) for task, row in zip(tasks, matrix, strict=True) if row[i] is not None]
    cells = [cell for _, cell in present]
    passed, failed, errors, cancelled, total = (_sum(cells, name) for name in SUMMED[:5])
    score_n, cost = _sum(cells, "score_n"), math.fsum(c.cost for c in cells)
    durations = [c.mean_duration for c in cells if c.duration_n]
    at_k, hat_k = _k_curves([row[i] for row in counts]) if repeats > 1 else ({}, {})
    return ArmSummary(
        key=arm.key,
        label=arm.label,
        run_id=arm.run_id,
        variant_slug=arm.variant_slug,
        is_baseline=False,
        trials=total,
        passed=passed,
        failed=failed,
        errors=errors,
        cancelled=cancelled,
        pending=total - passed - failed - errors - cancelled,
        pass_rate=pass_rate(passed, failed),
        low=interval[0] if interval else None,
        high=interval[1] if interval else None,
        interval="cluster bootstrap" if repeats > 1 else "Wilson",
        mean_score=math.fsum(c.score_sum for c in cells) / score_n if score_n else None,
        median_duration=statistics.median(durations) if durations else None,
        pass_at_k=at_k,
        pass_hat_k=hat_k,
        tokens=_sum(cells, "tokens"),
        cost=cost,
        cost_per_pass=cost / passed if passed else None,
        flaky=[task.slug for task, c in present if c.n >= 2 and 0 < c.passed < c.n],
        # Dataset rows each resolve their own config, so only a plain task's cell must agree.
        not_comparable=[
            task.slug for task, c in present if c.fingerprints[0] != c.fingerprints[1] and not c.dataset_rows
        ],
    )


def _sum(cells: list[Cell], name: str) -> int:
    return sum(getattr(cell, name) for cell in cells)


def _k_curves(counts: list[PassCount]) -> tuple[dict[int, float], dict[int, float]]:
    """Mean pass@k and pass^k over tasks, k = 1 … the smallest n (as stats.pass_at_k_curve).

    Tasks share few distinct (passes, n) pairs, so each pair is evaluated once and weighted by
    how many tasks have it: 1,000 tasks cost a few dozen binomial ratios, not 20,000.
    """
    tally = Counter((passes, n) for passes, n in counts if n > 0)
    if not tally:
        return {}, {}
    tasks = sum(tally.values())
    top = min(n for _, n in tally)
    curves = []
    for estimator in (stats.pass_at_k, stats.pass_hat_k):
        curves.append(
            {
                k: math.fsum(m * estimator(n, passes, k) for (passes, n), m in tally.items()) / tasks
                for k in range(1, top + 1)
            }
        )
    return curves[0], curves[1]


def _versus(tasks, counts, base: int, i: int, repeats: int, paired) -> Versus:
    both = [j for j, row in enumerate(counts) if row[base][1] and row[i][1]]
    if repeats > 1:
        # No task in common: stats.paired_bootstrap's answer for that case.
        delta, low, high, p_value = paired or (0.0, -1.0, 1.0, 1.0)
        test = "paired bootstrap"
    else:
        pairs = [(counts[j][base][0] == 1, counts[j][i][0] == 1) for j in both]
        delta, low, high = stats.paired_delta_interval_one_repeat(pairs)
        variant_only = sum(1 for b, v in pairs if v and not b)
        baseline_only = sum(1 for b, v in pairs if b and not v)
        p_value = stats.mcnemar_exact(variant_only, baseline_only)
        test = "McNemar exact"
    versus = Versus(len(both), delta, low, high, p_value, test)
    for j in both:
        (base_passes, base_n), (passes, n) = counts[j][base], counts[j][i]
        change = passes / n - base_passes / base_n
        if change:
            listed = versus.improved if change > 0 else versus.regressed
            listed.append(TaskDelta(tasks[j].slug, f"{base_passes}/{base_n}", f"{passes}/{n}", change))
    versus.improved.sort(key=lambda d: (-d.delta, d.slug))
    versus.regressed.sort(key=lambda d: (d.delta, d.slug))
    return versus


def _holm(arms: list[ArmSummary]) -> None:
    tested = [arm.versus for arm in arms if arm.versus and arm.versus.tasks]
    for versus, adjusted in zip(tested, stats.holm([v.p_value for v in tested]), strict=True):
        versus.p_holm = adjusted


# --- warnings ---------------------------------------------------------------------------------


def _warnings(data: ComparisonData, arms: list[ArmSummary], tasks: list[TaskInfo], repeats: int) -> list[str]:
    notes = []
    for run in data.runs:
        if not run.is_final:
            notes.append(f"Run #{run.pk} is {run.status}: these figures will change as trials finish.")
    for arm in arms:
        if arm.not_comparable:
            notes.append(
                f"Not comparable: in {arm.label}, trials of {_names(arm.not_comparable)} ran with "
                "different configurations (their fingerprints differ)."
            )
    if len(data.runs) > 1:
        notes += _changes_between_runs(data, tasks)
    if repeats > 1:
        for arm in arms:
            if arm.versus and 0 < arm.versus.tasks < FEW_TASKS:
                notes.append(
                    f"{arm.label} shares only {arm.versus.tasks} graded tasks with the baseline: "
                    "a bootstrap over so few tasks understates the uncertainty."
                )
    return notes


def _changes_between_runs(data: ComparisonData, tasks: list[TaskInfo]) -> list[str]:
    """Tasks whose bundle, or whose resolved config and grader, differ between the runs."""
    first = data.runs[0].pk
    task_changed: dict[int, list[str]] = defaultdict(list)
    config_changed: dict[int, list[str]] = defaultdict(list)
    arms_by_slug = defaultdict(list)
    for arm in data.arms:
        arms_by_slug[arm.variant_slug].append(arm)
    for run in data.runs[1:]:
        for task in tasks:
            old, new = data.digests.get((first, task.task_id)), data.digests.get((run.pk, task.task_id))
            if old and new and old != new:
                task_changed[run.pk].append(task.slug)
                continue
            for same in arms_by_slug.values():
                before = next((a for a in same if a.run_id == first), None)
                after = next((a for a in same if a.run_id == run.pk), None)
                if before and after and _fingerprints(data, before, task) != _fingerprints(data, after, task):
                    config_changed[run.pk].append(task.slug)
                    break
    notes = [
        f"Task changed between run #{first} and run #{run_id}: {_names(slugs)} (a new task version: "
        "its prompt, files or grader differ)."
        for run_id, slugs in task_changed.items()
    ]
    notes += [
        f"Configuration or grader changed between run #{first} and run #{run_id} for "
        f"{_names(slugs)} (same task version, different trial fingerprints)."
        for run_id, slugs in config_changed.items()
    ]
    return notes


def _fingerprints(data: ComparisonData, arm: Arm, task: TaskInfo) -> tuple[str, str] | None:
    cell = data.cells.get((arm.key, task.task_id))
    return cell.fingerprints if cell else None


def _names(slugs: list[str]) -> str:
    shown = ", ".join(slugs[:LISTED])
    return shown if len(slugs) <= LISTED else f"{shown} and {len(slugs) - LISTED} more"
