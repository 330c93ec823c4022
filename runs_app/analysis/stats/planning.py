"""Planning a run on the comparison's own test: the effect a design detects, the units or
repeats an effect needs, and the designs that can show nothing at all.

No Django. A design is C units (each its own cluster, as the comparison counts them by default)
× r repeats per variant, with m variants judged against the baseline. The comparison calls a
variant different when its Holm-adjusted p (over the m) is below α, where p is the larger of the
sign-flip test's and the cluster floor's (`inference.difference_interval`). So the planner:

1. Refuses a design no result of which can be significant: with C clusters the sign-flip
   test's p is at least 2/2^C, and Holm multiplies the smallest p by m, so C must exceed
   1 + log2(m/α) (`min_units`: 6 units for one variant at α = 0.05, 7 for two).
2. Simulates the design (`simulated_power`): each replicate draws every unit's baseline pass
   chance around the model's rate with the model's trial noise, lays the variant's effect on a
   share of the units (every unit when τ² = 0, fewer and larger as τ² grows, down to whole
   tasks flipping from fail to pass), draws the trials, and computes the comparison's p for each
   variant and Holm over them (the m - 1 others the same as the baseline: the hardest case for
   the one that differs).
   The comparison's bootstrap-t skew guard is left out (a resampling per simulated run would
   cost too much): it binds only where an effect sits on a few tasks, where a plan may then
   promise a few points more power than the run delivers.
3. Finds by bisection the smallest effect simulated to reach the power asked; the units or
   repeats an effect needs start from the t formula below and step up until the simulation
   reaches it.

The variance model (`VarianceModel.words` says it to users):
  w  (within-task variance): how much one task's outcome varies from try to try, p(1 - p)
     averaged over tasks: 0 when every task always passes or always fails, 0.25 for coin tosses.
     Repeats average it away: it enters as 2w/r.
  τ² (between-task variance of the effect): how unevenly a change lands across tasks: 0 when
     every task gains the same; larger when the gain sits on a few tasks. No number of repeats
     averages it away, only more tasks do.
The paired difference of one unit has variance σ²(r) = τ² + 2w/r (the design effect of r
repeats: 2w/r of it is trial noise), and the t formula detects |Δ| ≥ (t(1 - α/2m, C - 1) +
t(power, C - 1))·σ(r)/√C.

Without a pilot the model assumes a 50% pass rate with task difficulty spread like Beta(2, 2)
(w = 0.25 - 0.05 = 0.2) and the same effect on every task (τ² = 0). With a pilot, a finished run
of the experiment, the rate, w and τ² come from its own units (`pilot_model`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

import numpy as np

from runs_app.analysis.stats.comparison import ComparisonData
from runs_app.analysis.stats.inference import t_quantile, unseen_effect

ALPHA = 0.05
POWER = 0.8
EFFECTS = (0.05, 0.10, 0.20)  # the effects a plan says the needs of
MAX_UNITS = 100_000  # beyond this many units, "not reachable"
MAX_REPEATS = 1_000
REPLICATES = 400  # simulated runs per design: the power to about ±0.02
# Sign patterns drawn per simulated test above EXACT_UNITS units (all 2^C up to it); past
# NORMAL_UNITS the sign-flip distribution is taken as normal (its variance Σ D_c² is exact).
EXACT_UNITS = 12
FLIP_DRAWS = 1_000
NORMAL_UNITS = 400
BISECTIONS = 9  # the detectable effect to 1/512 of the reachable range


@dataclass(frozen=True)
class VarianceModel:
    within: float  # w: the variance of one trial's outcome within a unit
    between: float  # τ²: the variance of the true per-unit effect
    source: str  # where the figures come from, in words
    rate: float = 0.5  # the baseline's mean pass rate

    def unit_variance(self, repeats: int) -> float:
        return self.between + 2 * self.within / repeats

    def words(self, repeats: int) -> list[str]:
        """The model's terms as a user reads them."""
        noise = 2 * self.within / repeats
        total = self.unit_variance(repeats)
        lines = [
            f"Variance model ({self.source}): baseline pass rate {self.rate:.0%}; "
            f"w = {self.within:.3f}, how much a task's outcome varies from try to try (0: every "
            "task always passes or always fails; 0.25: coin tosses); repeats average it away. "
            f"τ² = {self.between:.4f}, how unevenly a change lands across tasks (0: every task "
            "gains the same; larger: the gain sits on a few tasks); only more tasks average it away.",
        ]
        if self.within < 1e-3:
            lines.append(
                "The tasks behave the same on every try (w ≈ 0): repeats add nothing; only more "
                "tasks make the comparison sharper."
            )
        elif total > 0:
            lines.append(
                f"Design effect: at {_count(repeats, 'repeat')}, trial noise (2w/r = {noise:.3f}) is "
                f"{noise / total:.0%} of each task's variance (τ² + 2w/r = {total:.3f}); more repeats "
                f"remove at most that share, more tasks shrink the whole as 1/√tasks."
            )
        return lines


ASSUMED = VarianceModel(
    0.2, 0.0, "assumed: no finished run yet; task difficulty ~ Beta(2, 2), one effect on every task"
)


@dataclass(frozen=True)
class Need:
    """What detecting `effect` takes: units at the plan's repeats, or repeats with its units
    (None: out of reach, `why` says why)."""

    effect: float
    units: int | None
    repeats: int | None
    why: str = ""


@dataclass(frozen=True)
class Plan:
    units: int
    repeats: int
    compared: int  # variants judged against the baseline (Holm over them)
    alpha: float
    power: float
    model: VarianceModel
    detectable: float | None  # None: no reachable effect is detected with `power`
    refusal: str  # why no result of this design can be significant, or ""
    needs: list[Need]
    replicates: int = REPLICATES

    @property
    def refused(self) -> bool:
        """No result of this design can show what was asked: refused, or no reachable effect."""
        return bool(self.refusal) or self.detectable is None

    def lines(self) -> list[str]:
        """The plan in words (evalrun --plan, the experiment page)."""
        head = f"{_count(self.units, 'unit')} × {_count(self.repeats, 'repeat')} per variant"
        against = f"{_count(self.compared, 'variant')} against the baseline"
        if self.refusal:
            return [f"{head}: {self.refusal}"]
        test = (
            f"with {self.power:.0%} power at α = {self.alpha:g} ({against}, Holm-adjusted; simulated "
            f"through the comparison's own test, {self.replicates} runs a design)"
        )
        if self.detectable is None:
            reach = 1 - self.model.rate
            lines = [
                f"{head}: detects no effect {test}: even a variant that fixed every failing trial "
                f"(+{reach * 100:.0f} pp) would be missed more than {1 - self.power:.0%} of the time. "
                "Add tasks."
            ]
        else:
            lines = [f"{head}: detects |Δ| ≥ {self.detectable * 100:.1f} pp {test}."]
        lines += self.model.words(self.repeats)
        for need in self.needs:
            effect = f"To detect {need.effect * 100:.0f} pp"
            if need.effect > 1 - self.model.rate:
                lines.append(f"{effect}: out of reach from a {self.model.rate:.0%} baseline.")
                continue
            by_units = _count(need.units, "unit") if need.units else f"more than {MAX_UNITS:,} units"
            by_repeats = (
                _count(need.repeats, "repeat") if need.repeats else f"no number of repeats ({need.why})"
            )
            lines.append(
                f"{effect}: {by_units} at {_count(self.repeats, 'repeat')}, or {by_repeats} with "
                f"{_count(self.units, 'unit')}."
            )
        return lines


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def min_units(alpha: float = ALPHA, compared: int = 1) -> int:
    """The fewest clusters whose smallest sign-flip p, 2/2^C, Holm-adjusted over `compared`
    variants, is below α."""
    units = 2
    while compared * 2.0 ** (1 - units) >= alpha:
        units += 1
    return units


def plan(
    units: int,
    repeats: int,
    model: VarianceModel = ASSUMED,
    *,
    compared: int = 1,
    alpha: float = ALPHA,
    power: float = POWER,
) -> Plan:
    repeats, compared = max(1, repeats), max(1, compared)
    fewest = min_units(alpha, compared)
    if units < fewest:
        smallest = 2.0 ** (1 - max(units, 1))
        holm = f", × {compared} by Holm = {compared * smallest:.3g}" if compared > 1 else ""
        refusal = (
            f"cannot show any difference, whatever the agents do: with {_count(units, 'unit')} the "
            f"comparison's paired test can give no p below 2/2^{units} = {smallest:.3g}{holm}, not "
            f"below α = {alpha:g}. At least {fewest} units are needed (tasks, or dataset rows); "
            "repeats do not help, since a task's repeats are not independent of each other."
        )
        return Plan(units, repeats, compared, alpha, power, model, None, refusal, [])
    return _simulated_plan(units, repeats, compared, model, alpha, power)


@lru_cache(maxsize=256)
def _simulated_plan(
    units: int, repeats: int, compared: int, model: VarianceModel, alpha: float, power: float
) -> Plan:
    detectable = detectable_effect(units, repeats, model, compared=compared, alpha=alpha, power=power)
    needs = [
        Need(
            effect,
            units_needed(effect, repeats, model, compared=compared, alpha=alpha, power=power),
            *repeats_needed(effect, units, model, compared=compared, alpha=alpha, power=power),
        )
        for effect in EFFECTS
    ]
    return Plan(units, repeats, compared, alpha, power, model, detectable, "", needs)


def formula_effect(units: int, repeats: int, model: VarianceModel, *, compared=1, alpha=ALPHA, power=POWER):
    """The t formula's detectable effect (the simulation's starting point)."""
    df = max(1, units - 1)
    quantiles = t_quantile(1 - alpha / (2 * compared), df) + t_quantile(power, df)
    return quantiles * math.sqrt(model.unit_variance(repeats) / units)


def detectable_effect(
    units: int, repeats: int, model: VarianceModel, *, compared=1, alpha=ALPHA, power=POWER
) -> float | None:
    """The smallest effect the simulated comparison detects with `power`; None when even the
    largest reachable one (every failing trial fixed) is not, or the design is refused."""
    if units < min_units(alpha, compared):
        return None
    reach = 1 - model.rate

    def enough(effect: float) -> bool:
        return simulated_power(units, repeats, compared, model, effect, alpha=alpha) >= power

    if reach <= 0 or not enough(reach):
        return None
    low, high = 0.0, reach
    for _ in range(BISECTIONS):
        middle = (low + high) / 2
        if enough(middle):
            high = middle
        else:
            low = middle
    return high


def units_needed(
    effect: float, repeats: int, model: VarianceModel, *, compared=1, alpha=ALPHA, power=POWER
) -> int | None:
    """The fewest units (about: steps of an eighth) simulated to detect `effect` at these
    repeats; None when unreachable."""
    if effect > 1 - model.rate:
        return None
    units = min_units(alpha, compared)
    while (
        formula_effect(units, repeats, model, compared=compared, alpha=alpha, power=power) > effect
        or floor_effect(units, alpha, compared) >= effect
    ):
        units = math.ceil(units * 1.25)
        if units > MAX_UNITS:
            return None
    return _step_up(
        units,
        lambda n: simulated_power(n, repeats, compared, model, effect, alpha=alpha) >= power,
        MAX_UNITS,
    )


def repeats_needed(
    effect: float, units: int, model: VarianceModel, *, compared=1, alpha=ALPHA, power=POWER
) -> tuple[int | None, str]:
    """The fewest repeats simulated to detect `effect` with these units, or None and why no
    number of repeats does."""
    if units < min_units(alpha, compared) or effect > 1 - model.rate:
        return None, "too few units for any result to be significant"
    floor = floor_effect(units, alpha, compared)
    if effect <= floor:
        return None, (
            f"with {units} units no Δ under {floor * 100:.1f} pp can be significant: an effect on a few "
            "tasks could be missing from so small a sample, whatever the repeats; add tasks"
        )
    if model.within < 1e-3:
        if simulated_power(units, 1, compared, model, effect, alpha=alpha) >= power:
            return 1, ""
        return None, "the tasks behave the same on every try: repeats add nothing; add tasks"
    df = units - 1
    quantiles = t_quantile(1 - alpha / (2 * compared), df) + t_quantile(power, df)
    allowed = units * (effect / quantiles) ** 2  # the largest unit variance that still detects it
    if allowed <= model.between:
        return None, "the effect's spread across tasks (τ²) remains however often each is repeated; add tasks"
    start = max(1, math.ceil(2 * model.within / (allowed - model.between)))
    found = None
    if start <= MAX_REPEATS:
        found = _step_up(
            start,
            lambda r: simulated_power(units, r, compared, model, effect, alpha=alpha) >= power,
            MAX_REPEATS,
        )
    return found, "" if found else f"more than {MAX_REPEATS:,} would be needed; add tasks"


def floor_effect(units: int, alpha: float = ALPHA, compared: int = 1) -> float:
    """The smallest |Δ| that can be significant over `units` clusters, Holm over `compared`: the
    comparison's floor (`inference.unseen_effect`) at α/compared."""
    return unseen_effect(units, alpha / compared)


def _step_up(start: int, enough, limit: int) -> int | None:
    """The first n from `start` up, in steps of an eighth, for which `enough(n)` holds."""
    n = start
    while not enough(n):
        n = max(n + 1, math.ceil(n * 1.125))
        if n > limit:
            return None
    return n


def simulated_power(
    units: int,
    repeats: int,
    compared: int,
    model: VarianceModel,
    effect: float,
    *,
    alpha: float = ALPHA,
    replicates: int = REPLICATES,
    seed: int = 0,
) -> float:
    """The share of simulated runs of the design in which the comparison calls the variant
    better: its Holm-adjusted p (over `compared` variants, the others identical to the
    baseline) below α and Δ above 0. One seed for every design (common random numbers), so the
    power grows smoothly with the effect, the units and the repeats."""
    rng = np.random.default_rng(seed)
    base_p = difficulties(model, (replicates, units), rng)
    share, size = laid_effect(effect, model)
    affected = rng.random((replicates, units)) < share
    arm_p = base_p + size * (1 - base_p) * affected
    base = rng.binomial(repeats, base_p)
    arm = rng.binomial(repeats, arm_p) - base
    p_values = [_paired_p(arm, repeats, rng)]
    for _ in range(compared - 1):
        p_values.append(_paired_p(rng.binomial(repeats, base_p) - base, repeats, rng))
    adjusted = _holm_first(np.array(p_values))
    return float(((adjusted < alpha) & (arm.sum(axis=1) > 0)).mean())


def laid_effect(effect: float, model: VarianceModel) -> tuple[float, float]:
    """(share, size): how an effect of mean `effect` lands on the units. A unit it lands on has
    `size` of its failing chance turned into passing (p → p + size·(1 - p)); the others are
    unchanged. The pair matches the effect's mean and its spread τ² across units:
    mean = share·size·(1 - μ), τ² + mean² = share·size²·E[(1 - p)²]; the same small gain on
    every unit when τ² = 0, whole tasks flipping (size 1) when τ² is as large as can be."""
    miss = 1 - model.rate
    if effect <= 0 or miss <= 0:
        return 0.0, 0.0
    square = miss**2 + max(0.0, model.rate * miss - model.within)  # E[(1 - p)²]
    size = (model.between + effect**2) * miss / (effect * square)
    if size >= 1:
        return min(1.0, effect / miss), 1.0
    share = effect / (size * miss)
    if share >= 1:
        return 1.0, min(1.0, effect / miss)
    return share, size


def difficulties(model: VarianceModel, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Units' pass chances with mean `rate` and E[p(1 - p)] = w: Beta(μk, (1 - μ)k) with
    k/(k + 1) = w/(μ(1 - μ)); every unit at μ when w is as large as can be, each unit always
    passing or always failing when w = 0."""
    mu = min(max(model.rate, 1e-9), 1 - 1e-9)
    ratio = model.within / (mu * (1 - mu))
    if ratio >= 1 - 1e-9:
        return np.full(shape, mu)
    if ratio <= 1e-9:
        return (rng.random(shape) < mu).astype(float)
    k = ratio / (1 - ratio)
    return rng.beta(mu * k, (1 - mu) * k, shape)


_FLIPS: dict[int, np.ndarray] = {}


def _paired_p(differences: np.ndarray, repeats: int, rng: np.random.Generator) -> np.ndarray:
    """The comparison's p of each simulated run (rows: runs; columns: units' passes of the arm
    minus the baseline's, over `repeats` each): the sign-flip test's p (`inference.sign_flip_p`:
    exact to EXACT_UNITS units, drawn patterns beyond, normal past NORMAL_UNITS), never below the
    cluster floor's 2(1 - |Δ|)^C (`inference.unseen_effect_p`)."""
    runs, units = differences.shape
    values = differences.astype(np.float64)
    observed = np.abs(values.sum(axis=1))
    if units <= EXACT_UNITS:
        if units not in _FLIPS:
            _FLIPS[units] = (((np.arange(1 << units)[:, None] >> np.arange(units)) & 1) * 2 - 1).astype(
                np.float64
            )
        patterns = _FLIPS[units]
        flipped = np.abs(patterns @ values.T)
        flip_p = (flipped >= observed - 1e-9).sum(axis=0) / len(patterns)
    elif units <= NORMAL_UNITS:
        patterns = rng.integers(0, 2, size=(FLIP_DRAWS, units)).astype(np.float64) * 2 - 1
        flipped = np.abs(patterns @ values.T)
        flip_p = (1 + (flipped >= observed - 1e-9).sum(axis=0)) / (FLIP_DRAWS + 1)
    else:
        spread = np.sqrt((values**2).sum(axis=1))
        z = np.divide(observed, spread, out=np.zeros(runs), where=spread > 0)
        flip_p = np.array([2 * (1 - NormalDist().cdf(v)) for v in z])
    delta = np.abs(values.mean(axis=1)) / repeats
    floor = np.minimum(1.0, 2 * (1 - np.minimum(1.0, delta)) ** units)
    return np.maximum(flip_p, floor)


def _holm_first(p_values: np.ndarray) -> np.ndarray:
    """The Holm-adjusted p of the first row among the rows (one column a run)."""
    m = len(p_values)
    if m == 1:
        return p_values[0]
    order = np.argsort(p_values, axis=0, kind="stable")
    ranked = np.take_along_axis(p_values, order, axis=0)
    adjusted = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m))[:, None] * ranked), axis=0)
    first = np.argmax(order == 0, axis=0)
    return adjusted[first, np.arange(p_values.shape[1])]


def pilot_model(data: ComparisonData, baseline: str | None, label: str) -> VarianceModel | None:
    """The baseline's rate, w and τ² from a finished run's units: w the mean unbiased within-unit
    variance of every arm (units with two graded trials or more), τ² what the spread of the
    per-unit differences against the baseline leaves once the within-unit part is taken out. A
    pilot of one repeat cannot tell them apart: it reads all of the spread as within-unit
    (τ² = 0). None when the pilot shares fewer than two graded units between two arms."""
    keys = [arm.key for arm in data.arms]
    baseline = baseline or data.default_baseline
    if baseline not in keys or len(keys) < 2:
        return None
    within, spreads, rates = [], [], []
    for unit in data.units:
        base = data.cells.get((baseline, *unit.key))
        if base and base.n:
            rates.append(base.passed / base.n)
        for key in keys:
            cell = data.cells.get((key, *unit.key))
            if cell and cell.n >= 2:
                rate = cell.passed / cell.n
                within.append(rate * (1 - rate) * cell.n / (cell.n - 1))
            if key != baseline and cell and cell.n and base and base.n:
                spreads.append((cell.passed / cell.n - base.passed / base.n, 1 / cell.n + 1 / base.n))
    if len(spreads) < 2:
        return None
    rate = math.fsum(rates) / len(rates)
    mean = math.fsum(d for d, _ in spreads) / len(spreads)
    variance = math.fsum((d - mean) ** 2 for d, _ in spreads) / (len(spreads) - 1)
    scale = math.fsum(s for _, s in spreads) / len(spreads)  # mean of 1/n_arm + 1/n_baseline
    if not within:
        within_only = min(variance / scale, rate * (1 - rate))
        return VarianceModel(within_only, 0.0, f"{label}, one repeat: all spread read as within-task", rate)
    w = math.fsum(within) / len(within)
    return VarianceModel(w, max(0.0, variance - w * scale), label, rate)
