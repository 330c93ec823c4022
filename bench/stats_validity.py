"""Coverage, false positives and power of the comparison's statistics, on seeded simulations.

Usage: python bench/stats_validity.py [replicates] [section ...]   (default 1000, every section;
about 15 minutes on two cores; sections: grid, sparse, gates, stopping, planner, cost, compare)

- grid: task difficulty ~ Beta(a, b), the variant changing every task's log-odds by `shift`. Per
  design (clusters × repeats): how often the 95% intervals of the baseline's rate and of Δ cover
  the true values, how often the sign-flip test rejects for identical variants (false positives)
  and for a shifted one (power).
- sparse: effects on a few tasks (a share of the failing tasks fixed, of the passing ones
  broken), near-deterministic and bimodal tasks, with repeats: Δ's coverage and how often each
  end of its interval misses on its own (each should be at most 2.5%).
- gates: how often no_regression passes a regression of 10 pp (it should not), one at its margin
  (at most 2.5%), and equal variants (its power).
- stopping: a team watching the run's units finish and stopping on the first claim: false claims
  with the anytime-valid interval (at most α) and with a fixed-sample interval looked at after
  every unit (what not to do).
- planner: the power the real compare() delivers at a plan's detectable effect (planned: 80%).
- cost: coverage of the paired Δ of cost per trial, for costs spread across tasks.
- compare: a single dataset task of 200 rows, and a variant that turns half of its fails into
  infrastructure errors, through the real compare().
"""

import math
import os
import sys
import time
from pathlib import Path

import django
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")
django.setup()

from runs_app.analysis.stats import compare, inference, planning  # noqa: E402
from runs_app.analysis.stats.simulation import (  # noqa: E402
    Design,
    comparison_data,
    draw,
    gate_passes,
    planned_data,
    stopping_claims,
    true_values,
    validity,
)

CLUSTERS = (10, 30, 100)
REPEATS = (1, 3)
DIFFICULTIES = ((2, 2), (4, 1), (0.5, 0.5))
SPARSE = (
    ("near-deterministic, 30% of fails fixed", Design(10, 3, 0.1, 0.1, fixes=0.3)),
    ("", Design(10, 5, 0.1, 0.1, fixes=0.3)),
    ("", Design(10, 10, 0.1, 0.1, fixes=0.3)),
    ("near-deterministic, 10% of fails fixed", Design(20, 3, 0.1, 0.1, fixes=0.1)),
    ("", Design(20, 5, 0.1, 0.1, fixes=0.1)),
    ("", Design(20, 10, 0.1, 0.1, fixes=0.1)),
    ("bimodal Beta(.1, .1), shift 0.8", Design(10, 3, 0.1, 0.1, shift=0.8)),
    ("Beta(.3, .3), 28% of passes broken", Design(40, 5, 0.3, 0.3, breaks=0.28)),
    ("Beta(.3, .3), 20% of passes broken", Design(80, 3, 0.3, 0.3, breaks=0.2)),
    ("Beta(.3, .3), 28% of fails fixed", Design(40, 5, 0.3, 0.3, fixes=0.28)),
)


def main(replicates: int, sections: list[str]) -> None:
    started = time.perf_counter()
    error = (0.95 * 0.05 / replicates) ** 0.5
    print(f"{replicates} replicates per cell; Monte Carlo error of a 95% share ±{error:.3f}")
    for name, section in SECTIONS.items():
        if not sections or name in sections:
            print()
            section(replicates)
    print(f"({time.perf_counter() - started:.0f} s)")


def grid(replicates: int) -> None:
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
    print(
        f"worst rate coverage {worst['rate']:.3f}, worst Δ coverage {worst['delta']:.3f}, "
        f"worst false-positive rate {worst['fp']:.3f} (α = 0.05)"
    )


def sparse(replicates: int) -> None:
    """Δ's coverage where the effect sits on a few tasks, and each end's own misses."""
    print(
        "sparse effects                          clusters repeats   true Δ  Δ cover  low misses  high misses"
    )
    for label, design in SPARSE:
        truth = true_values(design)[1]
        rng = np.random.default_rng(design.clusters * 100 + design.repeats)
        low_miss = high_miss = 0
        for _ in range(replicates):
            baseline, variant = draw(design, rng)
            delta = inference.difference_interval(baseline, variant, range(design.clusters))
            low_miss += delta.low > truth + 1e-12
            high_miss += delta.high < truth - 1e-12
        cover = 1 - (low_miss + high_miss) / replicates
        print(
            f"{label:<40}{design.clusters:>8} {design.repeats:>7}  {truth * 100:>+6.1f}pp  {cover:>7.3f}"
            f"  {low_miss / replicates:>10.3f}  {high_miss / replicates:>11.3f}"
        )
    print("(a good interval covers at least 0.95, and misses at most 0.025 at each end)")


def gates(replicates: int) -> None:
    """How often no_regression passes, through compare() and the gate."""
    runs = max(200, replicates // 2)
    cases = (
        ("default, -10 pp on every task", Design(10, 3, 2, 2, shift=-0.5), {"type": "no_regression"}),
        ("default, -10 pp on a few tasks", Design(10, 3, 2, 2, breaks=0.6), {"type": "no_regression"}),
        ("default, -10 pp on every task", Design(20, 3, 2, 2, shift=-0.5), {"type": "no_regression"}),
        ("default, -10 pp on every task", Design(100, 3, 2, 2, shift=-0.5), {"type": "no_regression"}),
        ("margin 10.2 pp, -10.23 pp on a few", Design(40, 5, 0.3, 0.3, breaks=0.28),
         {"type": "no_regression", "margin": 0.102}),
        ("default, -5.0 pp on every task", Design(200, 3, 2, 2, shift=-0.25), {"type": "no_regression"}),
        ("default, equal variants (power)", Design(100, 3, 2, 2), {"type": "no_regression"}),
        ("default, equal variants (power)", Design(300, 3, 2, 2), {"type": "no_regression"}),
    )  # fmt: skip
    print(f"no_regression ({runs} runs each)                 clusters repeats   true Δ  passes")
    for label, design, gate in cases:
        truth = true_values(design)[1]
        passed = gate_passes(design, gate, runs, seed=design.clusters)
        print(f"{label:<48}{design.clusters:>8} {design.repeats:>7}  {truth * 100:>+6.1f}pp  {passed:>6.3f}")
    print("(a regression beyond the margin should pass at most 0.025; the default margin is 5 pp)")


def stopping(replicates: int) -> None:
    print(
        "optional stopping, a look after every unit       units repeats   true Δ  anytime-valid  fixed-sample"
    )
    cases = (
        ("equal variants: 'better' or 'worse'", Design(200, 3, 2, 2), None),
        ("", Design(200, 1, 2, 2), None),
        ("", Design(200, 3, 0.3, 0.3), None),
        ("", Design(1000, 1, 2, 2), None),
        ("-5.2 pp: 'not worse by 5 pp' or 'better'", Design(200, 3, 2, 2, shift=-0.26), 0.05),
    )
    for label, design, margin in cases:
        truth = true_values(design)[1]
        anytime, fixed = stopping_claims(design, replicates, seed=design.clusters, margin=margin)
        print(
            f"{label:<49}{design.clusters:>6} {design.repeats:>7}  {truth * 100:>+6.1f}pp  {anytime:>13.3f}"
            f"  {fixed:>12.3f}"
        )
    print("(false claims: at most 0.05 for 'better' or 'worse', 0.025 for 'not worse')")


def planner(replicates: int) -> None:
    runs = max(150, replicates // 4)
    print(
        f"plans (real compare(), {runs} runs each)        units repeats variants  detects   delivered power"
    )
    cases = (
        (40, 3, 1, planning.ASSUMED),
        (40, 3, 2, planning.ASSUMED),
        (107, 3, 2, planning.ASSUMED),
        (30, 3, 1, planning.VarianceModel(0.0, 0.05, "deterministic tasks, sparse effect", 0.4)),
        (20, 10, 1, planning.VarianceModel(0.02, 0.03, "near-deterministic", 0.5)),
    )
    for units, repeats, compared, model in cases:
        plan = planning.plan(units, repeats, model, compared=compared)
        rng = np.random.default_rng(units + repeats)
        hits = 0
        for _ in range(runs):
            versus = compare.compare(planned_data(units, repeats, compared, model, plan.detectable, rng))
            v = versus.arm("new").versus
            hits += v.p_holm is not None and v.p_holm < 0.05 and v.delta > 0
        label = "assumed" if model is planning.ASSUMED else model.source
        print(
            f"{label:<45}{units:>6} {repeats:>7} {compared + 1:>8}  {plan.detectable * 100:>5.1f}pp"
            f"  {hits / runs:>16.3f}"
        )
    refused = planning.plan(5, 28)
    print(f"5 units × 28 repeats: refused ({refused.refusal[:60]}…)")


def cost(replicates: int) -> None:
    print("Δ cost per trial, paired (t interval)        units  tasks' cost spread  coverage")
    for units in (10, 30, 100):
        for sigma in (0.5, 0.8):
            rng = np.random.default_rng(units)
            truth = 0.5 * math.exp(sigma**2 / 2) * math.exp(0.045)
            covered = 0
            for _ in range(replicates):
                difficulty = rng.lognormal(0, sigma, units)
                trials = rng.integers(1, 5, size=(2, units))
                base = [
                    (float(difficulty[u] * rng.lognormal(0, 0.3, n).sum()), n)
                    for u, n in enumerate(trials[0])
                ]
                new = [
                    (float(1.5 * difficulty[u] * rng.lognormal(0, 0.3, n).sum()), n)
                    for u, n in enumerate(trials[1])
                ]
                got = inference.ratio_difference(new, base, range(units))
                covered += got.low <= truth <= got.high
            print(
                f"{'':<44}{units:>6}  {f'×{math.exp(sigma):.1f} at 1 sd':>18}  {covered / replicates:>8.3f}"
            )


def through_compare(replicates: int) -> None:
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
        better += versus.significant and versus.delta > 0
    print(
        f"identical variant turning half its fails into errors, 30 tasks × 3 ({runs} runs): "
        f"error difference flagged {flagged / runs:.3f}, Δ styled significantly positive {better / runs:.3f}"
    )


SECTIONS = {
    "grid": grid,
    "sparse": sparse,
    "gates": gates,
    "stopping": stopping,
    "planner": planner,
    "cost": cost,
    "compare": through_compare,
}


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 1000
    main(count, [arg for arg in sys.argv[1:] if not arg.isdigit()])
