"""Coverage, false positives and power of the comparison's statistics, on seeded simulations.

Usage: python bench/stats_validity.py [replicates]   (default 1000; about a minute)

Task difficulty ~ Beta(a, b); the variant changes every task's log-odds by `shift`. For each
design (clusters × repeats) it prints how often the 95% intervals of the baseline's rate and of Δ
cover the true values, how often the sign-flip test rejects at α = 0.05 for identical variants
(false positives) and for a shifted one (power), and then two cases through the real compare():
a single dataset task of 200 rows, and a variant that turns half of its fails into
infrastructure errors.
"""

import os
import sys
import time
from pathlib import Path

import django
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")
django.setup()

from runs_app.analysis.stats import compare  # noqa: E402
from runs_app.analysis.stats.simulation import Design, comparison_data, validity  # noqa: E402

CLUSTERS = (10, 30, 100)
REPEATS = (1, 3)
DIFFICULTIES = ((2, 2), (4, 1), (0.5, 0.5))


def main(replicates: int) -> None:
    started = time.perf_counter()
    error = (0.95 * 0.05 / replicates) ** 0.5
    print(f"{replicates} replicates per cell; Monte Carlo error of a 95% share ±{error:.3f}")
    print()
    print("difficulty    clusters repeats  rate cover  Δ cover (shift 0.8)", end="")
    print("  false pos (shift 0)  power (shift 0.8)")
    worst = {"rate": 1.0, "delta": 1.0, "fp": 0.0}
    for a, b in DIFFICULTIES:
        for clusters in CLUSTERS:
            for repeats in REPEATS:
                seed = clusters * 10 + repeats
                shifted = validity(Design(clusters, repeats, a, b, shift=0.8), replicates, seed=seed)
                same = validity(Design(clusters, repeats, a, b), replicates, seed=seed + 1)
                worst["rate"] = min(worst["rate"], shifted.rate_coverage, same.rate_coverage)
                worst["delta"] = min(worst["delta"], shifted.delta_coverage, same.delta_coverage)
                worst["fp"] = max(worst["fp"], same.rejected)
                print(
                    f"Beta({a:g}, {b:g})".ljust(14)
                    + f"{clusters:>8} {repeats:>7}  {min(shifted.rate_coverage, same.rate_coverage):>10.3f}"
                    f"  {shifted.delta_coverage:>19.3f}  {same.rejected:>18.3f}  {shifted.rejected:>17.3f}"
                )
    print()
    print(
        f"worst rate coverage {worst['rate']:.3f}, worst Δ coverage {worst['delta']:.3f}, "
        f"worst false-positive rate {worst['fp']:.3f} (α = 0.05)"
    )
    rng = np.random.default_rng(1)
    runs = max(100, replicates // 5)
    fp = widths = 0.0
    for _ in range(runs):
        result = compare.compare(comparison_data(Design(200, 1), rng, rows=True))
        base, new = result.arms
        widths += base.high - base.low
        fp += new.versus.p_holm < 0.05
    print(
        f"one dataset task of 200 rows, identical variants, through compare() ({runs} runs): "
        f"mean interval width {widths / runs:.3f}, false positives {fp / runs:.3f}"
    )
    flagged = better = 0
    for _ in range(runs):
        result = compare.compare(comparison_data(Design(30, 3, error_share=0.5), rng))
        versus = result.arms[1].versus
        flagged += versus.errors_differ
        better += versus.p_holm < 0.05 and versus.delta > 0
    print(
        f"identical variant turning half its fails into errors, 30 tasks × 3 ({runs} runs): "
        f"error difference flagged {flagged / runs:.3f}, Δ significantly positive {better / runs:.3f}"
    )
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
