"""Closed forms for the comparison pages: binomial intervals, pass@k, paired tables, multiplicity.

Pure Python (math, statistics): no Django. A task's result is a `PassCount`, `(passes, n)`.
The clustered estimates every page shows are built on these in `analysis.inference`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

PassCount = tuple[int, int]
"""(passes, n) for one task."""


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (Wilson 1927; Agresti & Coull 1998).

    With p = successes / n and z the two-sided normal quantile for `confidence`:

        centre = (p + z²/2n) / (1 + z²/n)
        half   = z / (1 + z²/n) · sqrt(p(1 - p)/n + z²/4n²)

    Unlike the Wald interval it stays inside [0, 1] and does not collapse to a point at 0/n or n/n.
    No trials (n = 0) says nothing: (0.0, 1.0).
    """
    _check_count(successes, n)
    z = _z(confidence)
    if n == 0:
        return (0.0, 1.0)
    low, high = _wilson(successes / n, n, z)
    # At 0/n and n/n the bound is exactly 0 or 1 on paper; rounding would leave ±1e-17.
    return (0.0 if successes == 0 else low, 1.0 if successes == n else high)


def wilson_cc_interval(p: float, n: float, z: float) -> tuple[float, float]:
    """Wilson's interval with continuity correction (Newcombe 1998, "Two-sided confidence
    intervals for the single proportion", method 4) for a proportion p over n draws (n may be
    fractional: an effective sample size), at the two-sided quantile z:

        low  = (2np + z² - 1 - z·√(z² - 2 - 1/n + 4p(n(1 - p) + 1))) / (2(n + z²)),  0 if p = 0
        high = (2np + z² + 1 + z·√(z² + 2 - 1/n + 4p(n(1 - p) - 1))) / (2(n + z²)),  1 if p = 1

    It covers at least its nominal level for small n, where the plain Wilson dips below it.
    """
    if n <= 0:
        return (0.0, 1.0)
    q = 1 - p
    denominator = 2 * (n + z * z)
    low = 0.0
    if p > 0:
        low = (
            2 * n * p + z * z - 1 - z * math.sqrt(max(0.0, z * z - 2 - 1 / n + 4 * p * (n * q + 1)))
        ) / denominator
    high = 1.0
    if p < 1:
        high = (
            2 * n * p + z * z + 1 + z * math.sqrt(max(0.0, z * z + 2 - 1 / n + 4 * p * (n * q - 1)))
        ) / denominator
    return (max(0.0, low), min(1.0, high))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c passed (Chen et al. 2021, arXiv:2107.03374, §2.1).

    pass@k = 1 - C(n - c, k) / C(n, k): the chance that k samples drawn without replacement
    from the n include at least one pass. The codex paper evaluates it as a float product to
    avoid overflowing C(n, k); Python's integers are exact and its int / int division rounds
    once, so the ratio of exact binomials is both simpler and more accurate.
    k > n is undefined (fewer than k samples): ValueError.
    """
    _check_k(n, c, k)
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Unbiased pass^k from n samples of which c passed: C(c, k) / C(n, k).

    The chance that k samples drawn without replacement all pass: how reliably the agent
    solves the task every time (Yao et al. 2024, τ-bench, arXiv:2406.12045). 0 when c < k.
    k > n is undefined: ValueError.
    """
    _check_k(n, c, k)
    return math.comb(c, k) / math.comb(n, k)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pairs b and c (McNemar 1947).

    Under the null each discordant pair goes either way with probability 1/2, so
    min(b, c) ~ Binomial(b + c, 1/2) and p = min(1, 2 · P(X ≤ min(b, c))), computed exactly
    with integers. No discordant pairs (b = c = 0): 1.0.
    """
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be >= 0, got b={b}, c={c}")
    n = b + c
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1))
    return min(1.0, 2 * tail / 2**n)


def fisher_exact_p(a: int, b: int, c: int, d: int) -> float:
    """Two-sided Fisher exact p-value of the 2×2 table [[a, b], [c, d]] (Fisher 1935), as
    scipy.stats.fisher_exact defines it: the hypergeometric probability of every table with the
    same margins that is no more likely than the observed one (within a relative 1e-7).
    Integers throughout, so exact; a unit's trial counts keep the tables small.
    """
    if min(a, b, c, d) < 0:
        raise ValueError(f"table counts must be >= 0, got {[[a, b], [c, d]]}")
    row, column, n = a + b, a + c, a + b + c + d
    weights = {x: math.comb(row, x) * math.comb(n - row, column - x)
               for x in range(max(0, column - (n - row)), min(row, column) + 1)}  # fmt: skip
    observed = weights[a]
    # w <= observed·(1 + 1e-7), in integers.
    tail = sum(w for w in weights.values() if w * 10_000_000 <= observed * 10_000_001)
    return min(1.0, tail / math.comb(n, column))


def newcombe_paired_interval(
    both: int, variant_only: int, baseline_only: int, neither: int, confidence: float = 0.95
) -> tuple[float, float, float]:
    """Difference of paired proportions with Newcombe's square-and-add interval (method 10).

    Newcombe, "Improved confidence intervals for the difference between binomial proportions
    based on paired data", Statistics in Medicine 17 (1998) 2635-2650; also Fagerland,
    Lydersen & Laake (2014), Statistics in Medicine 33, 2850-2875, who recommend it.
    With the table a = both, b = variant_only, c = baseline_only, d = neither, N = a+b+c+d:

    1. p1 = (a + b)/N (variant), p2 = (a + c)/N (baseline), Δ = p1 - p2 = (b - c)/N.
    2. Wilson intervals (l1, u1) for p1 and (l2, u2) for p2.
    3. φ, the correlation of the two margins, from A = ad - bc and M = product of the four
       margins: (A - N/2)/√M if A > N/2; 0 if 0 ≤ A ≤ N/2; A/√M if A < 0; 0 if a margin is 0.
    4. low  = Δ - √((p1 - l1)² + (u2 - p2)² - 2φ(p1 - l1)(u2 - p2))
       high = Δ + √((p2 - l2)² + (u1 - p1)² - 2φ(p2 - l2)(u1 - p1))

    No pairs: (0.0, -1.0, 1.0).
    """
    _alpha(confidence)
    cells = (both, variant_only, baseline_only, neither)
    if min(cells) < 0:
        raise ValueError(f"paired counts must be >= 0, got {cells}")
    a, b, c, d = cells
    total = a + b + c + d
    if total == 0:
        return (0.0, -1.0, 1.0)
    return newcombe_interval_z(a, b, c, d, _z(confidence))


def newcombe_interval_z(a: float, b: float, c: float, d: float, z: float) -> tuple[float, float, float]:
    """`newcombe_paired_interval` at the quantile z, on counts that may be fractional (an
    expected table of trial pairs, `analysis.inference.difference_interval`)."""
    total = a + b + c + d
    if total <= 0:
        return (0.0, -1.0, 1.0)
    p1, p2 = (a + b) / total, (a + c) / total
    l1, u1 = _wilson(p1, total, z)
    l2, u2 = _wilson(p2, total, z)
    phi = _newcombe_phi(a, b, c, d)
    delta = (b - c) / total
    low = delta - _root_sum_squares(p1 - l1, u2 - p2, phi)
    high = delta + _root_sum_squares(p2 - l2, u1 - p1, phi)
    return (delta, max(-1.0, low), min(1.0, high))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values (Holm 1979), in the input order.

    1. Sort the m p-values ascending: p(1) ≤ … ≤ p(m).
    2. adjusted(i) = max over j ≤ i of min(1, (m - j + 1) · p(j)), so they never decrease.
    3. Put each adjusted value back at its p-value's original position.
    """
    if not all(0.0 <= p <= 1.0 for p in p_values):
        raise ValueError(f"p-values must be within [0, 1], got {list(p_values)}")
    m = len(p_values)
    order = sorted(range(m), key=p_values.__getitem__)
    adjusted = [0.0] * m
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


def _wilson(p: float, n: float, z: float) -> tuple[float, float]:
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z / denominator * math.sqrt(max(0.0, p * (1 - p)) / n + z * z / (4 * n * n))
    return (max(0.0, centre - half), min(1.0, centre + half))


def _newcombe_phi(a: float, b: float, c: float, d: float) -> float:
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    if margins == 0:
        return 0.0
    half_total = (a + b + c + d) / 2
    cross = a * d - b * c
    if cross > half_total:
        return (cross - half_total) / math.sqrt(margins)
    if cross >= 0:
        return 0.0
    return cross / math.sqrt(margins)


def _root_sum_squares(x: float, y: float, phi: float) -> float:
    # Mathematically ≥ (x - y)² ≥ 0 since |φ| ≤ 1; max() absorbs a rounding step below zero.
    return math.sqrt(max(0.0, x * x + y * y - 2 * phi * x * y))


def _check_count(passes: int, n: int) -> None:
    if not 0 <= passes <= n:
        raise ValueError(f"need 0 <= passes <= n, got passes={passes}, n={n}")


def _check_k(n: int, c: int, k: int) -> None:
    _check_count(c, n)
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")


def _alpha(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    return 1.0 - confidence


def _z(confidence: float) -> float:
    return NormalDist().inv_cdf(1.0 - _alpha(confidence) / 2)
