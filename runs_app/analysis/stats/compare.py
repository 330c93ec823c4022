"""What a comparison computes from the loaded data: pure Python, no Django, no queries.

Used by the comparison pages, the run page, the command line, the reports, the API and the
gates: every one of them shows the rates, intervals and Δ computed here, so they agree.

An arm is one variant of one run; across several runs the same variant in two runs is two arms
("fast@12" and "fast@15"). The analysis unit is one (task, dataset row) pair; units pair across
arms by task and row, not by version (a task that changed between runs still pairs, a warning
names it, and no test is run across the change). Units are grouped into clusters, the
independent draws of every interval and test: each unit its own (`unit`, the default), by
`task`, or by a task's first `tag`. Outcomes are counted by the one rule of `analysis.tally`;
the estimates come from `analysis.inference`.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from experiments_app.specs.gates import NON_INFERIORITY_MARGIN
from runs_app.analysis.stats import inference, intervals, notes
from runs_app.analysis.stats.comparison import (
    ALPHA,
    CLUSTERINGS,
    CONFIDENCE,
    POWER,
    SUMMED,
    Arm,
    ArmSummary,
    BreakdownRow,
    Cell,
    Comparison,
    ComparisonData,
    HeatRow,
    Unit,
    UnitDelta,
    Versus,
)
from runs_app.analysis.stats.inference import Interval, PassCount


def compare(
    data: ComparisonData,
    *,
    baseline: str | None = None,
    tags: Iterable[str] = (),
    cluster: str = "unit",
    confidence: float = CONFIDENCE,
    alpha: float = ALPHA,
    seed: int = 0,
    final: bool | None = None,
) -> Comparison:
    """Per-arm statistics, each arm against the baseline, breakdowns, the heat-map and warnings.

    1. Keep the units whose task carries any of `tags` (all units when none).
    2. Per arm: the unit-weighted pass rate and its interval (`inference.rate_interval`), the
       same with every error counted as a fail, mean score, pass@k, cost per success.
    3. Per arm against the baseline, over the units both graded: both rates, Δ and its
       interval, the design's detectable effect, the sign-flip p (once every run is final and
       where the arms are comparable), the infrastructure-error test, the units that changed
       significantly on their own. Holm-adjust the p-values across arms.

    `final` overrides whether every run has ended (the gates judge a run with nothing pending
    just before storing its final status).
    """
    if cluster not in CLUSTERINGS:
        raise ValueError(f"unknown clustering {cluster!r}: choose one of {', '.join(CLUSTERINGS)}")
    keys = [arm.key for arm in data.arms]
    missing = "" if baseline else data.missing_baseline
    baseline = baseline or data.default_baseline
    if data.arms and baseline not in keys:
        raise ValueError(f"unknown baseline {baseline!r}: choose one of {', '.join(keys)}")
    wanted = set(tags)
    units = [unit for unit in data.units if not wanted or wanted & set(unit.task.tags)]
    clusters = [_cluster_key(unit, cluster) for unit in units]
    matrix = [[data.cells.get((key, *unit.key)) for key in keys] for unit in units]
    final = all(run.is_final for run in data.runs) if final is None else final
    base = keys.index(baseline) if data.arms and baseline is not None else 0
    columns = [_Column.of([row[i] for row in matrix]) for i in range(len(keys))]
    arms = [_summary(arm, columns[i], units, clusters, confidence) for i, arm in enumerate(data.arms)]
    draws = max(inference.DRAWS, math.ceil(20 * max(1, len(arms) - 1) / alpha))
    problem = notes.baseline_problem(data, missing, arms[base] if arms else None)
    if missing:
        baseline, base = missing, -1  # no arm is the baseline: none is compared with another
    for i, arm in enumerate(arms):
        arm.is_baseline = i == base
        if i != base and not problem:
            untested = notes.untested_reason(data, data.arms[base], data.arms[i], units)
            arm.versus = _versus(
                units, clusters, columns[base], columns[i], confidence, alpha, final, untested, draws, seed
            )
    _holm(arms)
    result = Comparison(
        runs=data.runs,
        arms=arms,
        baseline=baseline or "",
        tags=sorted(wanted),
        cluster=cluster,
        repeats=max((n for column in columns for _, n in column.graded), default=0),
        confidence=confidence,
        alpha=alpha,
        seed=seed,
        final=final,
        rows=_heat_rows(data, units, keys),
        units=len(units),
        by_tag=_by_tag(units, clusters, columns, confidence),
        by_criterion=_by_criterion(data, units, clusters, keys, confidence),
        warnings=[],
        quarantined=data.quarantined,
        baseline_problem=problem,
        overall=inference.rate_interval(
            [
                (sum(c.graded[j][0] for c in columns), sum(c.graded[j][1] for c in columns))
                for j in range(len(units))
            ],
            clusters,
            confidence,
        ),
    )
    result.warnings = notes.warnings(data, result, units)
    return result


def _cluster_key(unit: Unit, cluster: str) -> Hashable:
    if cluster == "task":
        return unit.task.task_id
    if cluster == "tag" and unit.task.tags:
        return ("tag", unit.task.tags[0])
    if cluster == "tag":
        return ("task", unit.task.task_id)
    return unit.key


@dataclass
class _Column:
    """One arm's cells over the units, each counted once through its Tally: (passes, graded),
    (passes, finished: every error a fail) and (infrastructure errors, finished). A Tally per
    use cost 1.8 million of them for a 10-run comparison."""

    cells: list[Cell | None]
    graded: list[PassCount]
    finished: list[PassCount]
    infra: list[PassCount]
    if_pass: list[PassCount]  # (passes and infrastructure errors, finished): every error a pass

    @classmethod
    def of(cls, cells: list[Cell | None]) -> _Column:
        graded: list[PassCount] = []
        finished: list[PassCount] = []
        infra: list[PassCount] = []
        if_pass: list[PassCount] = []
        for cell in cells:
            if cell is None:
                for column in (graded, finished, infra, if_pass):
                    column.append((0, 0))
                continue
            tally = cell.tally
            graded.append((cell.passed, tally.graded))
            finished.append((cell.passed, tally.finished))
            infra.append((tally.infra_errors, tally.finished))
            if_pass.append((cell.passed + tally.infra_errors, tally.finished))
        return cls(cells, graded, finished, infra, if_pass)


def _summary(arm: Arm, counted: _Column, units: list[Unit], clusters: list, confidence: float) -> ArmSummary:
    column = counted.cells
    cells = [cell for cell in column if cell is not None]
    totals = {name: sum(getattr(cell, name) for cell in cells) for name in SUMMED[:6]}
    rate = inference.rate_interval(counted.graded, clusters, confidence)
    if_fail = inference.rate_interval(counted.finished, clusters, confidence)
    graded_clusters = [key for (_, n), key in zip(counted.graded, clusters, strict=True) if n]
    scored = [
        (c.score_sum, c.score_n, key) for c, key in zip(column, clusters, strict=True) if c and c.score_n
    ]
    score = inference.ratio_interval(
        [s / n for s, n, _ in scored], [1] * len(scored), [k for *_, k in scored]
    )
    cost = math.fsum(cell.cost for cell in cells)
    per_pass = inference.ratio_interval(
        [c.cost for c in cells], [c.passed for c in cells], _keys(column, clusters)
    )
    per_trial = inference.ratio_interval(
        [c.cost for c in cells], [c.total - c.pending for c in cells], _keys(column, clusters)
    )
    durations = [cell.duration_sum / cell.duration_n for cell in cells if cell.duration_n]
    curves = _k_curves(counted.graded, clusters, confidence)
    finished = _in_finishing_order(counted.cells, counted.graded)
    cs_low, cs_high = inference.confidence_sequence([2 * p / n - 1 for p, n in finished], confidence)
    return ArmSummary(
        key=arm.key,
        label=arm.label,
        run_id=arm.run_id,
        variant_slug=arm.variant_slug,
        is_baseline=False,
        trials=totals["total"],
        passed=totals["passed"],
        failed=totals["failed"],
        errors=totals["errors"],
        agent_errors=totals["agent_errors"],
        cancelled=totals["cancelled"],
        tampered=sum(cell.tampered for cell in cells),
        pending=sum(cell.pending for cell in cells),
        units=len(graded_clusters),
        clusters=len(set(graded_clusters)),
        pass_rate=rate.estimate if rate else None,
        low=rate.low if rate else None,
        high=rate.high if rate else None,
        interval=_interval_words(rate),
        rate_if_errors_fail=if_fail.estimate if if_fail else None,
        rate_if_errors_fail_low=if_fail.low if if_fail else None,
        rate_if_errors_fail_high=if_fail.high if if_fail else None,
        mean_score=score.estimate if score else None,
        mean_score_low=max(0.0, score.low) if score and score.se is not None else None,
        mean_score_high=min(1.0, score.high) if score and score.se is not None else None,
        median_duration=statistics.median(durations) if durations else None,
        pass_at_k=curves["pass_at_k"],
        pass_at_k_low=curves["pass_at_k_low"],
        pass_at_k_high=curves["pass_at_k_high"],
        pass_at_k_units=curves["pass_at_k_units"],
        pass_hat_k=curves["pass_hat_k"],
        cs_low=(cs_low + 1) / 2,
        cs_high=(cs_high + 1) / 2,
        cs_units=len(finished),
        tokens=sum(cell.tokens for cell in cells),
        cost=cost,
        answerer_cost=math.fsum(cell.answerer_cost for cell in cells),
        judge_cost=math.fsum(cell.judge_cost for cell in cells),
        mean_cost_low=max(0.0, per_trial.low) if per_trial and per_trial.se is not None else None,
        mean_cost_high=per_trial.high if per_trial and per_trial.se is not None else None,
        cost_per_pass=per_pass.estimate if per_pass else None,
        cost_per_pass_low=max(0.0, per_pass.low) if per_pass and per_pass.se is not None else None,
        cost_per_pass_high=per_pass.high if per_pass and per_pass.se is not None else None,
        flaky=[
            unit.label for unit, (p, n) in zip(units, counted.graded, strict=True) if n >= 2 and 0 < p < n
        ],
        # Dataset rows each resolve their own config, so only a plain task's cell must agree.
        not_comparable=sorted(
            {
                unit.task.slug
                for unit, c in zip(units, column, strict=True)
                if c and c.fingerprints[0] != c.fingerprints[1] and not c.dataset_rows
            }
        ),
    )


def _keys(column: list[Cell | None], clusters: list) -> list:
    return [key for cell, key in zip(column, clusters, strict=True) if cell is not None]


def _in_finishing_order(cells: list[Cell | None], graded: list[PassCount]) -> list[PassCount]:
    """The graded counts of the units with nothing pending, in the order they were launched (a
    seeded random order of units: `launching`), which is the order they finish in."""
    done = [
        (cell.first_trial_id or 0, counts)
        for cell, counts in zip(cells, graded, strict=True)
        if cell is not None and counts[1] and not cell.pending
    ]
    return [counts for _, counts in sorted(done, key=lambda item: item[0])]


def _interval_words(rate: Interval | None) -> str:
    if rate is None:
        return ""
    if rate.se is None:
        return "Wilson over one cluster's trials"
    return f"cluster-robust t over {rate.clusters} clusters"


def _k_curves(counts: list[PassCount], clusters: list, confidence: float) -> dict[str, dict[int, Any]]:
    """Mean pass@k (with a floored interval) and pass^k for every k, over one fixed set of units:
    those with at least the arm's usual number of graded trials (its most common count), so the
    curve compares like with like at every k (a unit that lost trials to errors is left out of
    all of them; `pass_at_k_units` says how many units remain)."""
    curves: dict[str, dict[int, Any]] = {
        "pass_at_k": {},
        "pass_at_k_low": {},
        "pass_at_k_high": {},
        "pass_at_k_units": {},
        "pass_hat_k": {},
    }
    graded = [n for _, n in counts if n]
    if not graded:
        return curves
    usual = max(Counter(graded).items(), key=lambda item: (item[1], item[0]))[0]
    kept = [(p, n, key) for (p, n), key in zip(counts, clusters, strict=True) if n >= usual]
    keys = [key for *_, key in kept]
    for k in k_grid(usual):
        at = inference.floored_mean_interval([_pass_at_k(n, p, k) for p, n, _ in kept], keys, confidence)
        curves["pass_at_k"][k] = at.estimate
        curves["pass_at_k_low"][k] = at.low
        curves["pass_at_k_high"][k] = at.high
        curves["pass_at_k_units"][k] = len(kept)
        curves["pass_hat_k"][k] = math.fsum(_pass_hat_k(n, p, k) for p, n, _ in kept) / len(kept)
    return curves


def k_grid(top: int) -> list[int]:
    """The k a pass@k curve is given at for units of up to `top` graded trials: every k to 10,
    then 20, 50, 100, 200, 500, ... and `top` itself (none below two trials). Each k costs an
    interval over every unit; every k up to 200 repeats made the run page's comparison 10 ms."""
    if top < 2:
        return []
    steps = list(range(1, 11)) + [m * 10**e for e in range(1, 7) for m in (2, 5, 10)]
    return sorted({k for k in steps if k < top} | {top})


@lru_cache(maxsize=4096)
def _pass_at_k(n: int, c: int, k: int) -> float:
    return intervals.pass_at_k(n, c, k)


@lru_cache(maxsize=4096)
def _pass_hat_k(n: int, c: int, k: int) -> float:
    return intervals.pass_hat_k(n, c, k)


def _versus(
    units, clusters, base: _Column, other: _Column, confidence, alpha, final, untested, draws, seed
) -> Versus | None:
    baseline, arm = base.graded, other.graded
    delta = inference.difference_interval(baseline, arm, clusters, confidence, draws=draws, seed=seed)
    if delta is None:
        return None
    paired = [j for j, (b, a) in enumerate(zip(baseline, arm, strict=True)) if b[1] and a[1]]
    base_rate = math.fsum(baseline[j][0] / baseline[j][1] for j in paired) / len(paired)
    versus = Versus(
        units=len(paired),
        clusters=delta.clusters,
        baseline_rate=base_rate,
        arm_rate=base_rate + delta.estimate,
        delta=delta.estimate,
        low=delta.low,
        high=delta.high,
        se=delta.se,
        mde=inference.detectable_effect(delta.se, delta.clusters, alpha, POWER),
        test=None,
        untested=untested,
        alpha=alpha,
    )
    if not untested and not final:
        versus.untested = (
            "p-values are shown once the run has ended (a p-value watched while trials arrive is not valid)"
        )
    if not versus.untested:
        versus.p_value = delta.p_value
        draws_text = "exact" if delta.exact else f"{draws:,} draws"
        guard = ", bootstrap-t skew guard" if delta.clusters > inference.ENUMERATED_CLUSTERS else ""
        versus.test = f"sign-flip ({draws_text}), floored by the number of clusters{guard}"
    finished = [
        (
            min(b.first_trial_id or 0, a.first_trial_id or 0),
            arm[j][0] / arm[j][1] - baseline[j][0] / baseline[j][1],
        )
        for j in paired
        if (b := base.cells[j]) is not None
        and (a := other.cells[j]) is not None
        and not b.pending
        and not a.pending
    ]
    versus.cs_low, versus.cs_high = inference.confidence_sequence(
        [d for _, d in sorted(finished, key=lambda item: item[0])], confidence
    )
    versus.cs_units = len(finished)
    versus.decided = decision(versus.cs_low, versus.cs_high, versus.margin)
    _error_effects(versus, delta, base, other, clusters, confidence, alpha, draws, seed)
    _cost_effects(versus, base, other, clusters, confidence)
    _changed_units(versus, units, paired, baseline, arm)
    return versus


def _cost_effects(versus: Versus, base: _Column, other: _Column, clusters, confidence: float) -> None:
    """The arm's cost per trial and per passed trial minus the baseline's, over the units both
    arms ended trials of, with paired intervals (`inference.ratio_difference`)."""

    def per(column: _Column, denominator) -> list[tuple[float, float] | None]:
        return [
            (cell.cost, denominator(cell)) if cell is not None and cell.total > cell.pending else None
            for cell in column.cells
        ]

    for name, denominator in (("cost", lambda c: c.total - c.pending), ("cost_per_pass", lambda c: c.passed)):
        found = inference.ratio_difference(
            per(other, denominator), per(base, denominator), clusters, confidence
        )
        if found is not None:
            setattr(versus, f"{name}_delta", found.estimate)
            if found.se is not None:
                setattr(versus, f"{name}_delta_low", found.low)
                setattr(versus, f"{name}_delta_high", found.high)


def decision(low: float, high: float, margin: float = NON_INFERIORITY_MARGIN) -> str:
    """What an anytime-valid interval of Δ already shows: "better" or "worse" once it leaves
    0, "not worse" once its lower end is within the margin (the question of `no_regression`),
    "" while it shows none of these."""
    if low > 0:
        return "better"
    if high < 0:
        return "worse"
    if low >= -margin:
        return "not worse"
    return ""


def _error_effects(
    versus: Versus,
    delta: inference.PairedDelta,
    base: _Column,
    other: _Column,
    clusters,
    confidence: float,
    alpha: float,
    draws,
    seed,
) -> None:
    """Δ with every infrastructure error a fail and with every one a pass, and whether the arms'
    infrastructure-error shares differ."""
    if not any(n for n, _ in base.infra) and not any(n for n, _ in other.infra):
        # No infrastructure error in either arm: the three are Δ itself, and the shares are 0.
        for form in ("fail", "pass"):
            setattr(versus, f"delta_if_errors_{form}", delta.estimate)
            setattr(versus, f"delta_if_errors_{form}_low", delta.low)
            setattr(versus, f"delta_if_errors_{form}_high", delta.high)
        if any(b[1] and a[1] for b, a in zip(base.infra, other.infra, strict=True)):
            versus.baseline_error_share = versus.arm_error_share = 0.0
        return
    for form, counts in (("fail", (base.finished, other.finished)), ("pass", (base.if_pass, other.if_pass))):
        found = inference.difference_interval(*counts, clusters, confidence, draws=draws, seed=seed)
        if found is not None:
            setattr(versus, f"delta_if_errors_{form}", found.estimate)
            setattr(versus, f"delta_if_errors_{form}_low", found.low)
            setattr(versus, f"delta_if_errors_{form}_high", found.high)
    base_errors, arm_errors = base.infra, other.infra
    shares = inference.difference_interval(
        base_errors, arm_errors, clusters, confidence, draws=draws, seed=seed
    )
    if shares is None:
        return
    both = [(b, a) for b, a in zip(base_errors, arm_errors, strict=True) if b[1] and a[1]]
    versus.baseline_error_share = math.fsum(b[0] / b[1] for b, _ in both) / len(both)
    versus.arm_error_share = versus.baseline_error_share + shares.estimate
    if any(b[0] or a[0] for b, a in both):
        versus.error_p = shares.p_value
        versus.errors_differ = versus.error_p < alpha


def _robust_to_errors(versus: Versus) -> bool:
    """Whether Δ's interval leaves 0 on the same side with every infrastructure error a fail and
    with every one a pass (so no outcome of the trials they took could undo it)."""
    sides = []
    for form in ("fail", "pass"):
        low = getattr(versus, f"delta_if_errors_{form}_low")
        high = getattr(versus, f"delta_if_errors_{form}_high")
        if low is None or high is None:
            return True  # no error changes the units' counts
        sides.append(1 if low > 0 else -1 if high < 0 else 0)
    headline = 1 if versus.low > 0 else -1 if versus.high < 0 else 0
    return all(side == headline for side in sides)


def _changed_units(versus: Versus, units, paired: list[int], baseline, arm) -> None:
    """Units whose rate differs between the arms, largest change first, with how many would
    differ in each direction by chance (each unit's trials drawn at its pooled rate in both
    arms): with a few repeats a unit alone proves little, so the lists are read against that."""
    for j in paired:
        (bp, bn), (ap, an) = baseline[j], arm[j]
        change = ap / an - bp / bn
        up, down = _chance_of_change(bp + ap, bn, an)
        versus.improved_by_chance += up
        versus.regressed_by_chance += down
        if change:
            listed = versus.improved if change > 0 else versus.regressed
            listed.append(
                UnitDelta(units[j].label, f"{bp}/{bn}", f"{ap}/{an}", change, _fisher(bp, bn, ap, an))
            )
    versus.improved.sort(key=lambda d: (-d.delta, d.unit))
    versus.regressed.sort(key=lambda d: (d.delta, d.unit))


@lru_cache(maxsize=4096)
def _chance_of_change(passes: int, baseline_n: int, arm_n: int) -> tuple[float, float]:
    """P(the arm's rate > the baseline's) and P(<), both drawn Binomial at the pooled rate."""
    rate = passes / (baseline_n + arm_n)
    base = [
        math.comb(baseline_n, k) * rate**k * (1 - rate) ** (baseline_n - k) for k in range(baseline_n + 1)
    ]
    other = [math.comb(arm_n, k) * rate**k * (1 - rate) ** (arm_n - k) for k in range(arm_n + 1)]
    up = down = 0.0
    for kb, pb in enumerate(base):
        for ka, pa in enumerate(other):
            if ka * baseline_n > kb * arm_n:
                up += pb * pa
            elif ka * baseline_n < kb * arm_n:
                down += pb * pa
    return up, down


@lru_cache(maxsize=4096)
def _fisher(bp: int, bn: int, ap: int, an: int) -> float:
    return intervals.fisher_exact_p(ap, an - ap, bp, bn - bp)


def _holm(arms: list[ArmSummary]) -> None:
    tested = [arm.versus for arm in arms if arm.versus and arm.versus.p_value is not None]
    p_values = [versus.p_value for versus in tested if versus.p_value is not None]
    for versus, adjusted in zip(tested, intervals.holm(p_values), strict=True):
        versus.p_holm = adjusted
        versus.depends_on_errors = adjusted < versus.alpha and not _robust_to_errors(versus)


# --- breakdowns and the heat-map ------------------------------------------------------------------


def _heat_rows(data: ComparisonData, units: list[Unit], keys: list[str]) -> list[HeatRow]:
    """One row per task, its dataset rows merged into one cell per arm."""
    rows: dict[int, HeatRow] = {}
    for unit in units:
        row = rows.setdefault(unit.task.task_id, HeatRow(unit.task, [None] * len(keys)))
        for i, key in enumerate(keys):
            cell = data.cells.get((key, *unit.key))
            if cell is not None:
                earlier = row.cells[i]
                row.cells[i] = cell if earlier is None else earlier.merged(cell)
    return list(rows.values())


def _by_tag(units, clusters, columns: list[_Column], confidence: float) -> list[BreakdownRow]:
    rows = []
    for tag in sorted({tag for unit in units for tag in unit.task.tags}):
        chosen = [j for j, unit in enumerate(units) if tag in unit.task.tags]
        cells = [
            inference.rate_interval(
                [column.graded[j] for j in chosen], [clusters[j] for j in chosen], confidence
            )
            for column in columns
        ]
        rows.append(BreakdownRow(tag, cells))
    return rows


def _by_criterion(data, units, clusters, keys: list[str], confidence: float) -> list[BreakdownRow]:
    names = sorted({name for key, name in data.criteria if key in keys})
    cluster_of = {unit.key: key for unit, key in zip(units, clusters, strict=True)}
    rows = []
    for name in names:
        cells = []
        for key in keys:
            counts = data.criteria.get((key, name), {})
            kept = [(counts[u], cluster_of[u]) for u in counts if u in cluster_of]
            cells.append(inference.rate_interval([c for c, _ in kept], [k for _, k in kept], confidence))
        rows.append(BreakdownRow(name, cells))
    return rows
