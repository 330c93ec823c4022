"""Planning a run: the effect a design can detect, and the units or repeats an effect needs.

No Django. The paired difference of one unit run r times in each arm has variance

    σ²(r) = τ² + 2·w / r

where w is the within-unit variance of one trial (p(1 - p), averaged over units) and τ² the
spread of the variant's true effect across units. A design of C clusters detects, with power 1 - β
in a two-sided test at α, |Δ| ≥ (t(1 - α/2, C - 1) + t(1 - β, C - 1))·σ(r)/√C.

Without a pilot the model assumes a 50% pass rate with task difficulty spread like Beta(2, 2)
(w = 0.25 - 0.05 = 0.2) and the same effect on every task (τ² = 0). With a pilot, a finished run
of the experiment, w and τ² come from its own units (`pilot_model`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from runs_app.analysis.stats.comparison import ComparisonData
from runs_app.analysis.stats.inference import t_quantile

ALPHA = 0.05
POWER = 0.8
EFFECTS = (0.05, 0.10, 0.20)  # the effects a plan says the needs of
MAX_PLANNED = 1_000_000  # beyond this many units or repeats, "not reachable"


@dataclass(frozen=True)
class VarianceModel:
    within: float  # w: the variance of one trial's outcome within a unit
    between: float  # τ²: the variance of the true per-unit effect
    source: str  # where the figures come from, in words

    def unit_variance(self, repeats: int) -> float:
        return self.between + 2 * self.within / repeats


ASSUMED = VarianceModel(
    0.2, 0.0, "assumed: 50% pass rate, task difficulty ~ Beta(2, 2), one effect on every task"
)


@dataclass(frozen=True)
class Plan:
    units: int
    repeats: int
    alpha: float
    power: float
    model: VarianceModel
    detectable: float | None  # None below two units
    needs: list[
        tuple[float, int | None, int | None]
    ]  # (effect, units at these repeats, repeats at these units)

    def lines(self) -> list[str]:
        """The plan in words (evalrun --plan, the experiment page)."""
        head = f"{_count(self.units, 'unit')} × {_count(self.repeats, 'repeat')} per variant"
        if self.detectable is None:
            return [f"{head}: too few units to detect any effect (at least 2 are needed)."]
        lines = [
            f"{head}: detects |Δ| ≥ {self.detectable * 100:.1f} pp with {self.power:.0%} power at "
            f"α = {self.alpha:g} (two-sided, against the baseline).",
            f"Variance model: {self.model.source}.",
        ]
        for effect, units, repeats in self.needs:
            by_units = f"{units} units" if units else "more units than any run holds"
            by_repeats = f"{repeats} repeats" if repeats else "no number of repeats (add units)"
            lines.append(
                f"To detect {effect * 100:.0f} pp: {by_units} at {_count(self.repeats, 'repeat')}, or "
                f"{by_repeats} with {self.units} units."
            )
        return lines


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def plan(units: int, repeats: int, model: VarianceModel = ASSUMED, *, alpha=ALPHA, power=POWER) -> Plan:
    repeats = max(1, repeats)
    detectable = detectable_effect(units, repeats, model, alpha, power) if units >= 2 else None
    needs = [
        (
            effect,
            units_needed(effect, repeats, model, alpha, power),
            repeats_needed(effect, units, model, alpha, power),
        )
        for effect in EFFECTS
    ]
    return Plan(units, repeats, alpha, power, model, detectable, needs)


def detectable_effect(units: int, repeats: int, model: VarianceModel, alpha=ALPHA, power=POWER) -> float:
    df = max(1, units - 1)
    quantiles = t_quantile(1 - alpha / 2, df) + t_quantile(power, df)
    return quantiles * math.sqrt(model.unit_variance(repeats) / units)


def units_needed(effect: float, repeats: int, model: VarianceModel, alpha=ALPHA, power=POWER) -> int | None:
    """The fewest units that detect `effect` at these repeats (the t quantiles shrink with C)."""
    low, high = 2, 2
    while detectable_effect(high, repeats, model, alpha, power) > effect:
        high *= 2
        if high > MAX_PLANNED:
            return None
    while low < high:
        middle = (low + high) // 2
        if detectable_effect(middle, repeats, model, alpha, power) <= effect:
            high = middle
        else:
            low = middle + 1
    return high


def repeats_needed(effect: float, units: int, model: VarianceModel, alpha=ALPHA, power=POWER) -> int | None:
    """The fewest repeats that detect `effect` with these units; None when even infinitely many
    repeats would not (the effect's spread across units, τ², remains)."""
    if units < 2:
        return None
    df = units - 1
    quantiles = t_quantile(1 - alpha / 2, df) + t_quantile(power, df)
    allowed = units * (effect / quantiles) ** 2  # the largest unit variance that still detects it
    if allowed <= model.between:
        return None
    if model.within == 0:
        return 1
    needed = math.ceil(2 * model.within / (allowed - model.between))
    return max(1, needed) if needed <= MAX_PLANNED else None


def pilot_model(data: ComparisonData, baseline: str | None, label: str) -> VarianceModel | None:
    """w and τ² from a finished run's units: w the mean unbiased within-unit variance of every
    arm (units with two graded trials or more), τ² what the spread of the per-unit differences
    against the baseline leaves once the within-unit part is taken out. A pilot of one repeat
    cannot tell them apart: it reads all of the spread as within-unit (τ² = 0). None when the
    pilot shares fewer than two graded units between two arms."""
    keys = [arm.key for arm in data.arms]
    baseline = baseline or data.default_baseline
    if baseline not in keys or len(keys) < 2:
        return None
    within, spreads = [], []
    for unit in data.units:
        base = data.cells.get((baseline, *unit.key))
        for key in keys:
            cell = data.cells.get((key, *unit.key))
            if cell and cell.n >= 2:
                rate = cell.passed / cell.n
                within.append(rate * (1 - rate) * cell.n / (cell.n - 1))
            if key != baseline and cell and cell.n and base and base.n:
                spreads.append((cell.passed / cell.n - base.passed / base.n, 1 / cell.n + 1 / base.n))
    if len(spreads) < 2:
        return None
    mean = math.fsum(d for d, _ in spreads) / len(spreads)
    variance = math.fsum((d - mean) ** 2 for d, _ in spreads) / (len(spreads) - 1)
    scale = math.fsum(s for _, s in spreads) / len(spreads)  # mean of 1/n_arm + 1/n_baseline
    if not within:
        return VarianceModel(variance / scale, 0.0, f"{label} (one repeat: all spread read as within-unit)")
    w = math.fsum(within) / len(within)
    noise = w * scale
    return VarianceModel(
        w, max(0.0, variance - noise), f"{label}: w = {w:.3f}, τ² = {max(0.0, variance - noise):.4f}"
    )
