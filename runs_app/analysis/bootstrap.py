"""One bootstrap over tasks for every arm of a comparison at once (pure, no Django).

`analysis.compare.compare` calls it when a task ran more than once in an arm; the tests call it
directly on small count matrices.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from runs_app.analysis import stats

# 1,000 resamples: the 95% bounds move by about a tenth of a percentage point between seeds at
# 1,000 tasks, and the smallest bootstrap p (2/1001) survives a Holm correction over 9 variants.
# Each further 1,000 adds about 80 ms to the comparison page at 1,000 tasks × 10 variants.
ITERATIONS = 1000
CONFIDENCE = 0.95

PassCount = tuple[int, int]


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
