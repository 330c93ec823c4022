"""Clustered estimates and the paired test: what every rate, interval and Δ is computed with.

No Django. The analysis unit is one (task, dataset row) pair; a unit's result in an arm is its
graded trials, `(passes, n)`. Units may be grouped into clusters (every unit its own, by task, by
tag) whose results are correlated; every function here takes one cluster key per unit and
treats clusters, not trials, as the independent draws.

- `rate_interval`: the unit-weighted mean pass rate (each unit weighs the same, however many
  trials it had) with a cluster-robust t interval, floored near 0% and 100%.
- `difference_interval`: Δ = the same mean over units both arms graded, arm minus baseline,
  which is exactly the difference of the two arms' rates over those units; its interval is the
  sign-flip test inverted and floored by the number of clusters, so p and interval agree.
- `sign_flip_p`: the paired permutation test of Δ = 0 (exact where it can be enumerated).
- `ratio_interval`: any ratio of cluster sums (mean score, cost per success, pass@k) with the
  same cluster-robust t interval, unfloored; `ratio_difference` the paired difference of two
  such ratios (an arm's cost per trial or per pass minus the baseline's).

Why these and not a bootstrap: a percentile bootstrap over 10 clusters covers 91-93% and its
smallest p is 2/(B + 1). The t(C - 1) interval with the CR1 correction covers at least 94% from
10 clusters up in `bench/stats_validity.py`, except where the outcome sits near 0 or 1 and the
sample variance collapses; there the floor takes over: a continuity-corrected Wilson interval on
the effective sample size for a rate. Δ's floor is sized by the clusters alone: an effect on a
few tasks may be missing from a small sample however often each is repeated. The sign-flip test
is a permutation test, so its false-positive rate is at most α whatever the number of clusters.
`confidence_sequence` gives intervals valid at every moment of a run still going.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Sequence
from functools import lru_cache
from statistics import NormalDist
from typing import NamedTuple

import numpy as np

from runs_app.analysis.stats.intervals import wilson_cc_interval

PassCount = tuple[int, int]

# Above this many lattice points the exact sign-flip distribution is replaced by draws.
EXACT_LATTICE = 200_000
DRAWS = 20_000


class Interval(NamedTuple):
    estimate: float
    low: float
    high: float
    clusters: int
    se: float | None  # the cluster-robust standard error; None with a single cluster


@lru_cache(maxsize=512)
def t_quantile(q: float, df: int) -> float:
    # Imported here: scipy.special takes 0.7 s and 50 MB to load, which every worker and
    # command process would pay at start (scipy.stats: 2 s and 100 MB) for a quantile.
    from scipy.special import stdtrit

    return float(stdtrit(df, q))


def ratio_interval(
    numerators: Sequence[float],
    denominators: Sequence[float],
    clusters: Sequence[Hashable],
    confidence: float = 0.95,
) -> Interval | None:
    """θ = Σ numerators / Σ denominators with a cluster-robust (CR1) t interval.

    Per cluster c: A_c = Σ numerators, B_c = Σ denominators; e_c = A_c - θ·B_c;
    V = C/(C - 1) · Σ e_c² / (Σ B_c)²  (the linearised sandwich variance with the usual
    small-sample factor, Cameron & Miller 2015, "A practitioner's guide to cluster-robust
    inference", §VI); interval θ ± t(1 - α/2, C - 1)·√V. With denominators of 1 per unit it is
    the mean of the numerators; with one unit per cluster, the ordinary t interval.
    None when Σ denominators is 0; with one cluster, the interval is (θ, θ) and se None.
    """
    if len(set(clusters)) == len(clusters):  # a cluster per unit (the default): nothing to sum
        if len(numerators) != len(clusters) or len(denominators) != len(clusters):
            raise ValueError("numerators, denominators and clusters differ in length")
        a_c, b_c = numerators, denominators
    else:
        sums_a: dict[Hashable, float] = defaultdict(float)
        sums_b: dict[Hashable, float] = defaultdict(float)
        for a, b, key in zip(numerators, denominators, clusters, strict=True):
            sums_a[key] += a
            sums_b[key] += b
        a_c, b_c = list(sums_a.values()), [sums_b[key] for key in sums_a]
    total_b = math.fsum(b_c)
    if total_b <= 0:
        return None
    theta = math.fsum(a_c) / total_b
    count = len(b_c)
    if count < 2:
        return Interval(theta, theta, theta, count, None)
    residuals = math.fsum([(a - theta * b) ** 2 for a, b in zip(a_c, b_c, strict=True)])
    se = math.sqrt(count / (count - 1) * residuals) / total_b
    half = t_quantile(1 - (1 - confidence) / 2, count - 1) * se
    return Interval(theta, theta - half, theta + half, count, se)


def ratio_difference(
    arm: Sequence[tuple[float, float] | None],
    baseline: Sequence[tuple[float, float] | None],
    clusters: Sequence[Hashable],
    confidence: float = 0.95,
) -> Interval | None:
    """θ_arm - θ_baseline over paired units, each θ a ratio of sums (cost per trial: Σ cost /
    Σ trials; cost per passed trial: Σ cost / Σ passes), with a cluster-robust (CR1) t interval.

    Per unit a (numerator, denominator) in each arm, or None where the arm did not run it: the
    units with both are paired (a paired unit may have a zero denominator, a unit without a
    pass: its cost still counts). The difference's linearised residual of cluster c is
    e_c = (A_c - θ_a·B_c)/ΣB - (A'_c - θ_b·B'_c)/ΣB', so V = C/(C - 1)·Σ e_c² (the sandwich of
    `ratio_interval`, for two ratios over the same clusters: their covariance counted, which is
    what pairing gains). Unfloored: costs have no bound to floor against. None when no unit pairs
    or an arm's denominators sum to 0; one cluster gives (θ, θ) and se None."""
    rows = [(a, b, key) for a, b, key in zip(arm, baseline, clusters, strict=True) if a and b]
    if not rows:
        return None
    sums: dict[Hashable, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for (na, da), (nb, db), key in rows:
        cell = sums[key]
        cell[0] += na
        cell[1] += da
        cell[2] += nb
        cell[3] += db
    cells = list(sums.values())
    total_a, total_b = math.fsum(c[1] for c in cells), math.fsum(c[3] for c in cells)
    if total_a <= 0 or total_b <= 0:
        return None
    theta_a = math.fsum(c[0] for c in cells) / total_a
    theta_b = math.fsum(c[2] for c in cells) / total_b
    estimate = theta_a - theta_b
    count = len(cells)
    if count < 2:
        return Interval(estimate, estimate, estimate, count, None)
    residuals = [(c[0] - theta_a * c[1]) / total_a - (c[2] - theta_b * c[3]) / total_b for c in cells]
    se = math.sqrt(count / (count - 1) * math.fsum(e * e for e in residuals))
    half = t_quantile(1 - (1 - confidence) / 2, count - 1) * se
    return Interval(estimate, estimate - half, estimate + half, count, se)


def rate_interval(
    units: Sequence[PassCount], clusters: Sequence[Hashable], confidence: float = 0.95
) -> Interval | None:
    """The unit-weighted mean pass rate with its interval; units with n = 0 are left out.

    1. y_u = passes/n per unit; θ = the mean of y_u; the CR1 t interval of `ratio_interval`.
    2. Floor: a continuity-corrected Wilson interval (Newcombe 1998, method 4) for θ on the
       effective sample size n_eff = θ(1 - θ)/V (capped at the trials; the number of clusters
       when θ is 0 or 1, where V is 0), with the same t quantile. The result is the hull of
       both, inside [0, 1]. One cluster: the floor alone, over its trials.
    """
    # Floats, not Fractions: the interval is a float computation anyway, and exact rationals
    # made a 1,000-unit comparison spend seconds in arithmetic (the sign-flip test keeps them).
    kept = [(p / n, n, key) for (p, n), key in zip(units, clusters, strict=True) if n]
    if not kept:
        return None
    main = ratio_interval([y for y, _, _ in kept], [1] * len(kept), [key for *_, key in kept], confidence)
    assert main is not None  # some unit was kept
    trials = sum(n for _, n, _ in kept)
    theta, count = main.estimate, main.clusters
    effective: float
    if main.se is None:
        effective, q = trials, _z_quantile(confidence)
    else:
        q = t_quantile(1 - (1 - confidence) / 2, count - 1)
        variance = main.se**2
        if theta in (0.0, 1.0):
            effective = count
        elif variance == 0:
            effective = trials
        else:
            effective = min(trials, max(1.0, theta * (1 - theta) / variance))
    low, high = wilson_cc_interval(theta, effective, q)
    if main.se is not None:
        low, high = min(low, main.low), max(high, main.high)
    return Interval(theta, max(0.0, low), min(1.0, high), count, main.se)


class PairedDelta(NamedTuple):
    """Δ with its interval and the p of Δ = 0, consistent by construction: the interval excludes
    0 exactly when p < 1 - confidence."""

    estimate: float
    low: float
    high: float
    clusters: int
    se: float | None  # the cluster-robust standard error (for the detectable effect)
    p_value: float
    exact: bool  # the sign-flip distribution was enumerated, not drawn


def floored_mean_interval(
    values: Sequence[float], clusters: Sequence[Hashable], confidence: float = 0.95
) -> Interval:
    """The mean of per-unit values in [0, 1] (pass@k) with the cluster-robust t interval, floored
    as a rate's is: a continuity-corrected Wilson interval on the effective number of clusters
    (θ(1 - θ)/V, capped at the clusters; the clusters themselves where V is 0), inside [0, 1]."""
    main = ratio_interval(values, [1] * len(values), clusters, confidence)
    if main is None:
        raise ValueError("no values")
    theta, count = main.estimate, main.clusters
    if main.se is None or count < 2:
        low, high = wilson_cc_interval(theta, max(1, count), _z_quantile(confidence))
        return Interval(theta, low, high, count, main.se)
    variance = main.se**2
    effective = count if variance == 0 or theta in (0.0, 1.0) else min(count, theta * (1 - theta) / variance)
    low, high = wilson_cc_interval(
        theta, max(1.0, effective), t_quantile(1 - (1 - confidence) / 2, count - 1)
    )
    return Interval(theta, max(0.0, min(low, main.low)), min(1.0, max(high, main.high)), count, main.se)


def difference_interval(
    baseline: Sequence[PassCount],
    arm: Sequence[PassCount],
    clusters: Sequence[Hashable],
    confidence: float = 0.95,
    *,
    draws: int = DRAWS,
    seed: int = 0,
) -> PairedDelta | None:
    """Δ = mean over units both arms graded of (y_arm - y_baseline), its interval and its test.

    1. Per cluster c: D_c = Σ over its units of (y_arm - y_baseline), m_c its units; Δ = ΣD/Σm.
    2. The sign-flip test inverted: δ is in the interval when flipping the signs of the
       clusters' D_c - δ·m_c does not make |Σ (D_c - δ·m_c)| unusual at 1 - confidence (every
       sign pattern is equally likely when the clusters' differences are symmetric about δ).
       Its p at δ = 0 is the paired test. With C clusters no p is below 2/2^C, so below
       log2(2/α) clusters nothing is significant and the interval is [-1, 1].
    3. Floor, sized by the number of clusters alone (never by trials: repeats of a task are not
       independent draws): Δ ± ε with ε = 1 - (α/2)^(1/C). An effect confined to a share ε of
       the tasks is absent from a sample of C of them with chance (1 - ε)^C = α/2, so no sample
       pins Δ down closer than that, however many repeats each task has (`unseen_effect`). Its
       p is the chance that an effect as large as |Δ| went unseen: 2(1 - |Δ|)^C.
    4. Skew guard, past ENUMERATED_CLUSTERS clusters (below, the floor is wider than it could
       be): the studentised (bootstrap-t) interval over the clusters (`_bootstrap_t`). When an
       effect sits on a few tasks, the clusters' differences are skewed, and a sample that
       happened to catch few of them shows both a smaller effect and a smaller spread: the
       sign-flip bound on that side then misses about 4% of the time instead of 2.5%
       (bench/stats_validity.py). Resampling the studentised Δ carries that link.
    5. The interval is the hull of all, inside [-1, 1]; p is the largest of their p, so the
       interval excludes 0 exactly when p < 1 - confidence.
    None when no unit was graded in both arms.
    """
    rows = [
        (pb / nb, pa / na, key)
        for (pb, nb), (pa, na), key in zip(baseline, arm, clusters, strict=True)
        if nb and na
    ]
    if not rows:
        return None
    keys = list(dict.fromkeys(key for *_, key in rows))
    index = {key: i for i, key in enumerate(keys)}
    sums = np.zeros(len(keys))
    sizes = np.zeros(len(keys))
    for yb, ya, key in rows:
        sums[index[key]] += ya - yb
        sizes[index[key]] += 1
    estimate = float(sums.sum() / sizes.sum())
    alpha = 1 - confidence
    main = ratio_interval(list(sums), list(sizes), keys, confidence)
    se = main.se if main is not None else None
    flips = _SignFlips(sums, sizes, draws, seed)
    low, high = flips.interval(estimate, alpha)
    flip_p, exact = flips.p_value(0.0), flips.exact
    if not exact:  # at 0 the exact lattice is cheap: the headline p is never a draw's
        tested = sign_flip_p(baseline, arm, clusters, draws=draws, seed=seed)
        flip_p = max(flip_p, tested[0]) if tested else flip_p
        exact = bool(tested and tested[1])
    reach = unseen_effect(len(keys), alpha)
    p_value = max(flip_p, unseen_effect_p(abs(estimate), len(keys)))
    low, high = min(low, estimate - reach), max(high, estimate + reach)
    if len(keys) > ENUMERATED_CLUSTERS:
        boot_low, boot_high, boot_p = _bootstrap_t(sums, sizes, alpha, seed)
        low, high, p_value = min(low, boot_low), max(high, boot_high), max(p_value, boot_p)
    if p_value >= alpha:  # the two p agree on "not significant": so does the interval
        low, high = min(low, 0.0), max(high, 0.0)
    return PairedDelta(estimate, max(-1.0, low), min(1.0, high), len(keys), se, min(1.0, p_value), exact)


# Above this many clusters the sign patterns are drawn, not enumerated.
ENUMERATED_CLUSTERS = 16
_CHUNK = 512
RESAMPLES = 2_000  # of the bootstrap-t skew guard
_RESAMPLE_CELLS = 2_000_000  # resamples × clusters drawn at once (16 MB of indices)


def _bootstrap_t(sums: np.ndarray, sizes: np.ndarray, alpha: float, seed: int) -> tuple[float, float, float]:
    """The bootstrap-t interval of Δ = ΣD/Σm over clusters, and its p of Δ = 0, consistent:
    0 is outside the interval exactly when p < α.

    1. Δ̂ and its CR1 standard error ŝ (as `ratio_interval`).
    2. RESAMPLES seeded resamples of the clusters with replacement; each gives t* = (Δ* - Δ̂)/s*
       (0 where s* is 0: a resample of identical clusters says nothing about the spread).
    3. With k = ⌈α·B/2⌉: the interval is [Δ̂ - t*₍ₖ₎ŝ, Δ̂ - t*₍ₖ'₎ŝ], t*₍ₖ₎ the k-th largest t*
       and t*₍ₖ'₎ the k-th smallest; p = 2·min(#(t* ≥ t₀), #(t* ≤ t₀))/B at t₀ = Δ̂/ŝ.
    Hall (1992), "The Bootstrap and Edgeworth Expansion", §3.5: the studentised interval is
    second-order correct where the mean is skewed. With ŝ = 0 it is the point Δ̂."""
    count = len(sums)
    total_m = float(sizes.sum())
    estimate = float(sums.sum()) / total_m
    residual = sums - estimate * sizes
    se = math.sqrt(count / (count - 1) * float((residual**2).sum())) / total_m
    if se == 0:
        return estimate, estimate, 0.0 if estimate else 1.0
    rng = np.random.default_rng(seed)
    studentised = []
    step = max(1, _RESAMPLE_CELLS // count)
    for start in range(0, RESAMPLES, step):
        picks = rng.integers(0, count, size=(min(step, RESAMPLES - start), count))
        d, m = sums[picks], sizes[picks]
        sum_d, sum_m = d.sum(axis=1), m.sum(axis=1)
        delta = sum_d / sum_m
        spread = ((d - delta[:, None] * m) ** 2).sum(axis=1)
        s = np.sqrt(count / (count - 1) * spread) / sum_m
        studentised.append(np.divide(delta - estimate, s, out=np.zeros_like(delta), where=s > 0))
    t = np.sort(np.concatenate(studentised))
    k = max(1, math.ceil(alpha * RESAMPLES / 2))
    low, high = estimate - t[-k] * se, estimate - t[k - 1] * se
    t0 = estimate / se
    p_value = 2 * min(int((t >= t0).sum()), int((t <= t0).sum())) / RESAMPLES
    return low, high, min(1.0, p_value)


class _SignFlips:
    """The sign-flip test of Δ = δ for every δ, on one set of sign patterns: all 2^C of them,
    or `draws` seeded ones (the same for every δ, so p(δ) is one step function)."""

    def __init__(self, sums: np.ndarray, sizes: np.ndarray, draws: int, seed: int):
        self.total, self.size = float(sums.sum()), float(sizes.sum())
        self.exact = len(sums) <= ENUMERATED_CLUSTERS
        if self.exact:
            patterns = ((np.arange(1 << len(sums))[:, None] >> np.arange(len(sums))) & 1) * 2 - 1
            self.flipped_sums, self.flipped_sizes = patterns @ sums, patterns @ sizes
        else:
            rng = np.random.default_rng(seed)
            flipped_sums, flipped_sizes = [], []
            for start in range(0, draws, _CHUNK):
                patterns = rng.integers(0, 2, size=(min(_CHUNK, draws - start), len(sums)), dtype=np.int8)
                patterns = patterns * 2 - 1
                flipped_sums.append(patterns @ sums)
                flipped_sizes.append(patterns @ sizes)
            self.flipped_sums, self.flipped_sizes = (
                np.concatenate(flipped_sums),
                np.concatenate(flipped_sizes),
            )

    def p_value(self, delta: float) -> float:
        observed = abs(self.total - delta * self.size) * (1 - 1e-9) - 1e-12  # ties count
        hits = int((np.abs(self.flipped_sums - delta * self.flipped_sizes) >= observed).sum())
        if self.exact:
            return hits / len(self.flipped_sums)
        return (1 + hits) / (len(self.flipped_sums) + 1)

    def interval(self, estimate: float, alpha: float) -> tuple[float, float]:
        """The δ not rejected at `alpha`, by bisection from the estimate outwards."""
        return self._bound(estimate, -1.0, alpha), self._bound(estimate, 1.0, alpha)

    def _bound(self, inside: float, edge: float, alpha: float) -> float:
        if self.p_value(edge) > alpha:
            return edge
        for _ in range(40):  # to 2^-40 of the range
            middle = (inside + edge) / 2
            if self.p_value(middle) > alpha:
                inside = middle
            else:
                edge = middle
        return inside


def unseen_effect(clusters: int, alpha: float) -> float:
    """The largest effect (on a share of the tasks, at most 1 on each) that a sample of
    `clusters` tasks misses entirely with chance α/2: 1 - (α/2)^(1/C)."""
    return 1 - (alpha / 2) ** (1 / max(1, clusters))


def unseen_effect_p(effect: float, clusters: int) -> float:
    """The two-sided chance that an effect of this size on a share of the tasks went unseen."""
    return min(1.0, 2 * (1 - min(1.0, effect)) ** max(1, clusters))


def sign_flip_p(
    baseline: Sequence[PassCount],
    arm: Sequence[PassCount],
    clusters: Sequence[Hashable],
    *,
    draws: int = DRAWS,
    seed: int = 0,
) -> tuple[float, bool] | None:
    """Two-sided p of Δ = 0 by flipping the sign of each cluster's summed difference.

    Under the null the two arms' trials of a unit are exchangeable, so each cluster's
    D_c = Σ (y_arm - y_baseline) is as likely to be -D_c: every one of the 2^C sign patterns is
    equally likely, and p = P(|Σ ±D_c| ≥ |Σ D_c|). With one repeat per unit this is McNemar's
    exact test. Returns (p, exact) or None when no unit was graded in both arms.

    The D_c are rationals: scaled by the least common multiple of the trial counts and divided
    by their greatest common divisor they are integers v_c, and Σ ±v_c = 2T - Σ v_c with
    T = Σ v_c·J_c, J_c ~ Bernoulli(1/2). T's distribution is exact up to `EXACT_LATTICE`
    points (from its generating function); beyond, `draws` seeded draws of T give
    p = (1 + hits)/(draws + 1).
    """
    pairs = [(pb, nb, pa, na, key) for (pb, nb), (pa, na), key in zip(baseline, arm, clusters, strict=True)
             if nb and na]  # fmt: skip
    if not pairs:
        return None
    # Integers from the start (every D_c times the lcm of the trial counts), reduced by their
    # gcd: the same distribution up to scale, without rational arithmetic per unit.
    common = math.lcm(*{n for _, nb, _, na, _ in pairs for n in (nb, na)})
    sums: dict[Hashable, int] = defaultdict(int)
    for pb, nb, pa, na, key in pairs:
        sums[key] += pa * (common // na) - pb * (common // nb)
    nonzero = [value for value in sums.values() if value]
    if not nonzero:
        return 1.0, True
    divisor = math.gcd(*nonzero)
    values = [abs(value) // divisor for value in nonzero]
    observed = abs(sum(nonzero)) // divisor
    total = sum(values)
    groups = sorted(Counter(values).items())
    if total + 1 <= EXACT_LATTICE:
        statistic = np.abs(2 * np.arange(total + 1) - total)
        p_value = float(_lattice_pmf(groups, total)[statistic >= observed].sum())
        # The observed signs and their mirror always count: p >= 2 / 2^C (rounding aside).
        return min(1.0, max(p_value, 2.0 ** (1 - len(values)))), True
    hits = int((np.abs(2 * _drawn_sums(values, draws, seed) - total) >= observed).sum())
    return (1 + hits) / (draws + 1), False


def _drawn_sums(values: list[int], draws: int, seed: int) -> np.ndarray:
    """`draws` seeded draws of T = Σ v_c·J_c. The clusters go in blocks of eight: a table of
    each block's 256 partial sums, then one random byte per block and draw picks an entry.
    A binomial per distinct value cost 58 ms a test where units' trial counts differ (their
    lcm makes hundreds of distinct values); this costs about 10 ms at 1,000 clusters."""
    rng = np.random.default_rng(seed)
    blocks = np.array(values + [0] * (-len(values) % 8), dtype=np.int64).reshape(-1, 8)
    bits = (np.arange(256)[:, None] >> np.arange(8)) & 1
    tables = blocks @ bits.T
    picks = rng.integers(0, 256, size=(len(blocks), draws), dtype=np.uint8)
    sums = np.zeros(draws, dtype=np.int64)
    for table, pick in zip(tables, picks, strict=True):
        sums += table[pick]
    return sums


def _lattice_pmf(groups: list[tuple[int, int]], total: int) -> np.ndarray:
    """P(T = t) for t = 0..total, T = Σ v·Binomial(c, 1/2) over the (v, c) groups: the inverse
    DFT of T's generating function Π ((1 + z^v) / 2)^c at the (total + 1)-th roots of unity
    (T <= total, so nothing wraps around at a power of two past it, where the FFT is fastest:
    25 ms at 55,001 points against 3 ms at 65,536). At z = e^{-iθ}, (1 + z) / 2 = e^{-iθ/2}·cos(θ/2), so
    the product is a real magnitude and a phase: O(groups × total) real operations, where
    convolving the binomials one by one cost O(total²)."""
    size = 1 << total.bit_length()
    k = np.arange(size // 2 + 1)  # T is real: the other half of the spectrum mirrors this one
    magnitude = np.ones(len(k))
    phase = np.zeros(len(k))
    for value, count in groups:
        half_angle = np.pi * (k * value % size) / size
        magnitude *= np.cos(half_angle) ** count
        phase = (phase - count * half_angle) % (2 * np.pi)
    return np.clip(np.fft.irfft(magnitude * np.exp(1j * phase), n=size)[: total + 1], 0, None)


def detectable_effect(
    se: float | None, clusters: int, alpha: float = 0.05, power: float = 0.8
) -> float | None:
    """The smallest |Δ| the comparison's test detects with `power` at `alpha`, over `clusters`
    clusters with Δ's standard error `se`: (t(1 - α/2, C - 1) + t(power, C - 1))·se, never below
    the floor the number of clusters sets (`unseen_effect`); None when no Δ can be detected:
    the sign-flip test cannot reach α below log2(2/α) clusters (p ≥ 2/2^C)."""
    if clusters < 2 or 2.0 ** (1 - clusters) >= alpha:
        return None
    df = clusters - 1
    from_spread = (t_quantile(1 - alpha / 2, df) + t_quantile(power, df)) * se if se else 0.0
    return min(1.0, max(from_spread, unseen_effect(clusters, alpha)))


def _z_quantile(confidence: float) -> float:
    return NormalDist().inv_cdf(1 - (1 - confidence) / 2)


def confidence_sequence(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """An anytime-valid interval for the mean of values in [-1, 1] (unit rates, or unit Δs),
    given in the order they arrived: it holds at every moment at once, so a team may watch a
    live run and stop when it excludes 0 without inflating its error rate (Waudby-Smith &
    Ramdas 2023, the hedged capital process with predictable plug-in bets, §4).

    1. For a candidate mean m, one gambler bets value after value that the values run above m,
       another that they run below, never more than they can lose. Under the true mean each
       one's capital is a nonnegative martingale, so it ever reaches 2/α with chance at most
       α/2 (Ville's inequality); m is out once either has.
    2. The upward gambler's capital falls as m rises and the downward one's grows, so the means
       still in are one interval: from the largest m the first has ruled out to the smallest m
       the second has. Each end is found by bisection on its own gambler.
    3. Ruled out "at any moment so far" makes the interval the running intersection, which never
       widens. Should the two ends cross (values that do not look like draws around one mean),
       the interval of the current capital alone is given, which is also valid at every moment.
    (-1, 1) before any value."""
    x = (np.asarray(values, dtype=float) + 1) / 2  # onto [0, 1]
    if not len(x):
        return -1.0, 1.0
    threshold = math.log(2 / (1 - confidence))
    steps = np.arange(1, len(x) + 1)
    mean_after = (0.5 + np.cumsum(x)) / (steps + 1)
    spread = (0.25 + np.cumsum((x - mean_after) ** 2)) / (steps + 1)
    spread_before = np.concatenate([[0.25], spread[:-1]])
    bets = np.sqrt(2 * threshold / (spread_before * steps * np.log1p(steps)))

    def capital(m: float, sign: int, so_far: bool) -> bool:
        """Whether the gambler betting on `sign` has reached 2/α (ever, or now)."""
        m = min(max(m, 1e-12), 1 - 1e-12)
        cap = 0.5 / m if sign > 0 else 0.5 / (1 - m)
        logs = np.cumsum(np.log1p(sign * np.minimum(bets, cap) * (x - m)))
        return bool((logs.max() if so_far else logs[-1]) >= threshold)

    def ends(so_far: bool) -> tuple[float, float]:
        low = _last_true(lambda m: capital(m, 1, so_far))
        high = 1 - _last_true(lambda m: capital(1 - m, -1, so_far))
        return low, high

    low, high = ends(so_far=True)
    if low > high:
        low, high = ends(so_far=False)
    low, high = min(low, high), max(low, high)
    return 2 * low - 1, 2 * high - 1


def _last_true(ruled_out: Callable[[float], bool]) -> float:
    """The edge in [0, 1] of a condition true up to it and false beyond it (0 when false at 0),
    by bisection; the side where it is true is returned (the wider interval)."""
    if not ruled_out(0.0):
        return 0.0
    inside, outside = 0.0, 1.0
    for _ in range(40):
        middle = (inside + outside) / 2
        if ruled_out(middle):
            inside = middle
        else:
            outside = middle
    return inside
