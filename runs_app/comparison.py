"""Compare the variants of one run, or of several runs of one experiment.

Used by the comparison pages, the command line and the reports. Two steps, so a page can build
its form (baseline and tag choices) between them:

1. `load(runs)` runs three queries: the current trials grouped in SQL by (run, variant, task
   version) with their counts and sums, then the task versions and the variants they name.
2. `compare(data, baseline=…, tags=…)` computes everything else in Python (no queries).

`compare_runs(runs, …)` does both. An arm is one variant of one run; across several runs the
same variant in two runs is two arms ("fast@12" and "fast@15"), so a new run compares against
an old one. Tasks pair across arms by Task, not by version: a task that changed between runs
still pairs, and a warning names it.

Outcomes follow the house rule: pass rate = passed / (passed + failed); `error` trials never
count as fails and are reported apart, `cancelled` and unfinished trials are left out.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from django.db import connections
from django.db.models import Count, F, Max, Min, Q, Sum
from django.db.models.functions import Collate

from experiments_app.models import TaskVersion, Variant
from runs_app import stats
from runs_app.models import Run, Trial

# 1,000 resamples: the 95% bounds move by about a tenth of a percentage point between seeds at
# 1,000 tasks, and the smallest bootstrap p (2/1001) survives a Holm correction over 9 variants.
# Each further 1,000 adds about 80 ms to the comparison page at 1,000 tasks × 10 variants.
ITERATIONS = 1000
CONFIDENCE = 0.95
# Below this many paired tasks a bootstrap interval is too narrow to trust (stats docstring).
FEW_TASKS = 10
# Warnings list this many task names, then "and N more".
LISTED = 10

PassCount = tuple[int, int]
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
        return self.passed / self.n if self.n else None

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
        # `is_latest IN (true)`, not Trial.objects.latest(): SQLite renders is_latest=True as a
        # bare `is_latest`, which cannot seek trial_run_variant_task_idx; with the equality it
        # reads the index in GROUP BY order and skips a sort (90 ms instead of 140 ms).
        Trial.objects.filter(run_id__in=run_ids, is_latest__in=[True])
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


# --- statistics -------------------------------------------------------------------------------


def compare_runs(runs: Sequence[Run], **options: Any) -> Comparison:
    """Load and compare in one call (command line, reports)."""
    return compare(load(runs), **options)


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
        pass_rate=passed / (passed + failed) if passed + failed else None,
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


def task_bootstrap(
    counts: Sequence[Sequence[PassCount]],
    baseline: int,
    *,
    iterations: int = ITERATIONS,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> tuple[list[tuple[float, float] | None], list[stats.PairedResult | None]]:
    """One bootstrap over tasks for every arm at once.

    `counts[t][a]` is (passes, n) of task t in arm a. Returns, per arm, the percentile interval
    of its pooled pass rate (as `stats.cluster_bootstrap_pass_rate`), and per arm other than
    `baseline` its mean per-task Δ against it with interval and p (as `stats.paired_bootstrap`,
    same p formula); None where an arm has no graded trial or no task in common.

    Resampling the same tasks for every arm keeps the arms' correlation, and makes the page
    fast without numpy: each task becomes one integer holding every sum the statistics need,
    in bit fields just wide enough for the largest possible total, so a resample is one
    `sum()` of drawn integers (about 60 µs for 1,000 tasks and 10 arms).

    1. Fields per arm: Σ passes and Σ n; per arm against the baseline: Σ (d·L + L) and the
       number of tasks both graded, where d = rate_arm - rate_baseline and L is the least
       common multiple of every n, so d·L is an exact integer and d·L + L ≥ 0.
    2. Draw as many tasks as there are, with replacement (random.Random(seed)); sum them and
       split the fields back. Repeat `iterations` times.
    3. Pooled rate = Σ passes / Σ n; mean Δ = (Σ field - L·count) / (L·count), compared with 0
       exactly in integers. Intervals are percentiles; p = min(1, 2·(1 + min(#≤0, #≥0))/(B + 1)).
    """
    tasks = len(counts)
    arms = len(counts[0]) if tasks else 0
    ns = {n for row in counts for _, n in row if n}
    scale = math.lcm(*ns) if ns else 1
    others = [a for a in range(arms) if a != baseline]
    packed, layout = _pack([_task_fields(row, baseline, others, scale) for row in counts])
    rates: list[list[float]] = [[] for _ in range(arms)]
    means: dict[int, list[tuple[int, int]]] = {a: [] for a in others}
    rng = random.Random(seed)
    for _ in range(iterations if tasks else 0):
        total = sum(rng.choices(packed, k=tasks))
        sums = [(total >> shift) & mask for shift, mask in layout]
        for a in range(arms):
            if sums[2 * a + 1]:
                rates[a].append(sums[2 * a] / sums[2 * a + 1])
        for j, a in enumerate(others):
            shifted, both = sums[2 * arms + 2 * j], sums[2 * arms + 2 * j + 1]
            if both:
                means[a].append((shifted - scale * both, scale * both))
    alpha = 1 - confidence
    intervals = []
    for arm_rates in rates:
        arm_rates.sort()
        intervals.append(
            (stats.quantile(arm_rates, alpha / 2), stats.quantile(arm_rates, 1 - alpha / 2))
            if arm_rates
            else None
        )
    paired: list[stats.PairedResult | None] = [None] * arms
    for a in others:
        paired[a] = _paired_result(
            [row[baseline] for row in counts], [row[a] for row in counts], means[a], alpha
        )
    return intervals, paired


def _pack(fields: list[list[int]]) -> tuple[list[int], list[tuple[int, int]]]:
    """Each task's non-negative fields as one integer, and each field's (shift, mask).

    A field's width holds its largest value times the number of tasks: a resample's total,
    which draws that many tasks, can never carry into the next field.
    """
    if not fields:
        return [], []
    layout, shift = [], 0
    for column in zip(*fields, strict=True):
        width = (len(fields) * max(column)).bit_length() or 1
        layout.append((shift, (1 << width) - 1))
        shift += width
    packed = [sum(value << at for value, (at, _) in zip(row, layout, strict=True)) for row in fields]
    return packed, layout


def _task_fields(row: Sequence[PassCount], baseline: int, others: list[int], scale: int) -> list[int]:
    fields = [value for passes, n in row for value in (passes, n)]
    base_passes, base_n = row[baseline]
    for a in others:
        passes, n = row[a]
        if n and base_n:
            fields += [passes * (scale // n) - base_passes * (scale // base_n) + scale, 1]
        else:
            fields += [0, 0]
    return fields


def _paired_result(base_counts, arm_counts, draws: list[tuple[int, int]], alpha: float):
    diffs = [p / n - bp / bn for (bp, bn), (p, n) in zip(base_counts, arm_counts, strict=True) if n and bn]
    if not diffs or not draws:
        return None
    at_or_below = sum(1 for numerator, _ in draws if numerator <= 0)
    at_or_above = sum(1 for numerator, _ in draws if numerator >= 0)
    ordered = sorted(numerator / denominator for numerator, denominator in draws)
    return stats.PairedResult(
        math.fsum(diffs) / len(diffs),
        stats.quantile(ordered, alpha / 2),
        stats.quantile(ordered, 1 - alpha / 2),
        min(1.0, 2 * (1 + min(at_or_below, at_or_above)) / (len(draws) + 1)),
    )


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


# --- per-trial table ---------------------------------------------------------------------------

TRIAL_COLUMNS = [
    "trial",
    "run",
    "variant",
    "task",
    "task_version",
    "replicate",
    "dataset_row",
    "attempt",
    "status",
    "score",
    "duration_s",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_creation_tokens",
    "cost_usd",
    "turns",
    "timed_out",
    "budget_exceeded",
    "error_category",
    "config_fingerprint",
]


def trial_rows(runs: Sequence[Run], task_ids: Iterable[int] | None = None) -> Iterator[dict[str, Any]]:
    """The current trials of `runs` (optionally of some tasks only), one flat dict each."""
    trials = Trial.objects.filter(run__in=list(runs)).latest().order_by("pk")
    if task_ids is not None:
        trials = trials.filter(task_version__task_id__in=list(task_ids))
    values = trials.values_list(
        "pk",
        "run_id",
        "variant__slug",
        "task_version__task__slug",
        "task_version__number",
        "replicate",
        "dataset_row_id",
        "attempt",
        "status",
        "score",
        "duration_seconds",
        "input_tokens",
        "output_tokens",
        "cache_read_tokens",
        "cache_creation_tokens",
        "cost_usd",
        "turns",
        "timed_out",
        "budget_exceeded",
        "error_category",
        "config_fingerprint",
    )
    for row in values.iterator(chunk_size=2000):
        yield dict(zip(TRIAL_COLUMNS, row, strict=True))
