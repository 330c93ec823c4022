"""The clustered estimates and the sign-flip test: against statsmodels and scipy, by brute force,
and on seeded simulations (coverage, false positives) through the estimators and compare()."""

import itertools
import math
import random

import numpy as np
import pytest
import statsmodels.api as sm
from scipy import stats as scipy_stats

from runs_app.analysis.stats import compare, inference, intervals
from runs_app.analysis.stats.simulation import Design, comparison_data, validity

# --- against references --------------------------------------------------------------------------


def test_its_cluster_robust_standard_error_is_statsmodels_cr1():
    rng = np.random.default_rng(3)
    values = rng.random(60)
    groups = np.repeat(np.arange(12), 5)
    fit = sm.OLS(values, np.ones(60)).fit(
        cov_type="cluster", cov_kwds={"groups": groups, "use_correction": True, "df_correction": True}
    )
    got = inference.ratio_interval(list(values), [1] * 60, list(groups))
    assert got.estimate == pytest.approx(fit.params[0], abs=1e-12)
    assert got.se == pytest.approx(fit.bse[0], rel=1e-10)
    half = scipy_stats.t.ppf(0.975, 11) * fit.bse[0]
    assert (got.low, got.high) == pytest.approx((fit.params[0] - half, fit.params[0] + half), rel=1e-10)


def test_with_one_unit_per_cluster_it_is_the_ordinary_t_interval():
    values = [0.2, 0.5, 0.9, 0.4, 0.7, 0.1, 1.0, 0.6]
    got = inference.ratio_interval(values, [1] * len(values), range(len(values)))
    low, high = scipy_stats.t.interval(0.95, len(values) - 1, np.mean(values), scipy_stats.sem(values))
    assert (got.low, got.high) == pytest.approx((low, high), rel=1e-10)


def test_a_rate_is_the_hull_of_the_t_interval_and_the_floor_on_the_effective_sample():
    units = [(3, 3), (1, 3), (2, 3), (0, 3), (3, 3), (2, 3), (1, 3), (3, 3), (2, 3), (2, 3)]
    got = inference.rate_interval(units, range(10))
    main = inference.ratio_interval([p / n for p, n in units], [1] * 10, range(10))
    effective = got.estimate * (1 - got.estimate) / main.se**2
    floor = intervals.wilson_cc_interval(got.estimate, effective, scipy_stats.t.ppf(0.975, 9))
    assert got.low == pytest.approx(max(0, min(main.low, floor[0])))
    assert got.high == pytest.approx(min(1, max(main.high, floor[1])))


def test_a_rate_at_the_edge_keeps_a_width_from_its_clusters():
    got = inference.rate_interval([(3, 3)] * 12, range(12))
    # Every unit passed: the floor is the continuity-corrected Wilson for 12/12 at t(11).
    expected = intervals.wilson_cc_interval(1.0, 12, scipy_stats.t.ppf(0.975, 11))
    assert (got.estimate, got.low, got.high) == pytest.approx((1.0, *expected))
    assert got.low < 0.8


def test_units_of_one_cluster_count_once():
    units = [(1, 1)] * 12 + [(0, 1)] * 12
    by_unit = inference.rate_interval(units, range(24))
    by_task = inference.rate_interval(units, [i // 4 for i in range(24)])  # 6 tasks of 4 rows
    assert by_unit.clusters == 24 and by_task.clusters == 6
    assert by_task.se > by_unit.se and by_task.high - by_task.low > by_unit.high - by_unit.low


def test_delta_is_the_difference_of_the_rates_over_the_paired_units():
    baseline = [(1, 2), (0, 2), (2, 2), (0, 0)]
    arm = [(2, 2), (1, 2), (2, 2), (1, 1)]
    got = inference.difference_interval(baseline, arm, range(4))
    assert got.estimate == pytest.approx((1 / 2 + 1 / 2 + 0) / 3)
    assert got.low < got.estimate < got.high


def test_a_ratio_difference_with_one_trial_a_unit_is_the_paired_t_interval():
    rng = np.random.default_rng(6)
    base = rng.lognormal(0, 0.5, 25)
    new = base * rng.lognormal(0.2, 0.3, 25)
    got = inference.ratio_difference([(x, 1) for x in new], [(x, 1) for x in base], range(25))
    differences = new - base
    low, high = scipy_stats.t.interval(0.95, 24, differences.mean(), scipy_stats.sem(differences))
    assert (got.estimate, got.low, got.high) == pytest.approx((differences.mean(), low, high), rel=1e-9)


def test_a_ratio_difference_covers_the_difference_of_mean_costs():
    """Costs per unit skewed (lognormal, tasks' costs a factor 1.6 apart at one standard
    deviation), trials per unit varying, arms correlated through the unit: the paired interval of
    Δ cost per trial covers about 93% at 30 units (a t interval on skewed costs falls short of 95%
    with few tasks; with a factor of 2.2 it covers about 91%: bench/stats_validity.py prints it)."""
    rng = np.random.default_rng(7)
    covered = 0
    for _ in range(1000):
        difficulty = rng.lognormal(0, 0.5, 30)
        trials = rng.integers(1, 5, size=(2, 30))
        base = [(float(difficulty[u] * rng.lognormal(0, 0.3, n).sum()), n) for u, n in enumerate(trials[0])]
        new = [
            (float(1.5 * difficulty[u] * rng.lognormal(0, 0.3, n).sum()), n) for u, n in enumerate(trials[1])
        ]
        got = inference.ratio_difference(new, base, range(30))
        # The population Δ per trial: E[0.5·difficulty·e^(0.045)] (lognormal means).
        truth = 0.5 * math.exp(0.125) * math.exp(0.045)
        covered += got.low <= truth <= got.high
    assert covered / 1000 >= 0.92


def test_the_sign_flip_test_is_mcnemars_with_one_repeat():
    rng = random.Random(4)
    for _ in range(30):
        pairs = [(rng.random() < 0.5, rng.random() < 0.6) for _ in range(rng.randint(5, 60))]
        baseline = [(int(b), 1) for b, _ in pairs]
        arm = [(int(a), 1) for _, a in pairs]
        variant_only = sum(1 for b, a in pairs if a and not b)
        baseline_only = sum(1 for b, a in pairs if b and not a)
        p_value, exact = inference.sign_flip_p(baseline, arm, range(len(pairs)))
        assert exact and p_value == pytest.approx(
            intervals.mcnemar_exact(variant_only, baseline_only), abs=1e-12
        )


def test_the_sign_flip_test_matches_brute_force_enumeration_with_repeats():
    rng = random.Random(9)
    for _ in range(10):
        tasks = rng.randint(3, 11)
        baseline = [(rng.randint(0, 3), 3) for _ in range(tasks)]
        arm = [(rng.randint(0, 4), 4) for _ in range(tasks)]
        clusters = [i // 2 for i in range(tasks)]  # pairs of units share a cluster
        sums = {}
        for (bp, bn), (ap, an), key in zip(baseline, arm, clusters, strict=True):
            sums[key] = sums.get(key, 0) + ap / an - bp / bn
        values = list(sums.values())
        observed = abs(sum(values))
        hits = sum(
            abs(sum(s * v for s, v in zip(signs, values, strict=True))) >= observed - 1e-9
            for signs in itertools.product((1, -1), repeat=len(values))
        )
        p_value, exact = inference.sign_flip_p(baseline, arm, clusters)
        assert exact and p_value == pytest.approx(hits / 2 ** len(values), abs=1e-9)


def test_beyond_the_exact_lattice_it_draws_and_agrees(monkeypatch):
    rng = random.Random(2)
    baseline = [(rng.randint(0, 5), 5) for _ in range(80)]
    arm = [(min(7, rng.randint(0, 6) + 1), 7) for _ in range(80)]
    exact, was_exact = inference.sign_flip_p(baseline, arm, range(80))
    monkeypatch.setattr(inference, "EXACT_LATTICE", 10)
    drawn, was_drawn = inference.sign_flip_p(baseline, arm, range(80), draws=40_000)
    assert was_exact and not was_drawn
    assert drawn == pytest.approx(exact, abs=3 * math.sqrt(exact * (1 - exact) / 40_000) + 1 / 40_000)


def test_the_exact_lattice_is_the_convolution_of_the_binomials():
    rng = random.Random(5)
    for _ in range(50):
        groups = sorted({rng.randint(1, 40): rng.randint(1, 50) for _ in range(rng.randint(1, 6))}.items())
        total = sum(value * count for value, count in groups)
        expected = np.ones(1)
        for value, count in groups:
            kernel = np.zeros(value * count + 1)
            kernel[::value] = scipy_stats.binom.pmf(np.arange(count + 1), count, 0.5)
            expected = np.convolve(expected, kernel)
        got = inference._lattice_pmf(groups, total)
        assert len(got) == total + 1 and np.abs(got - expected).max() < 1e-14


def test_draws_with_many_distinct_cluster_sums_follow_the_sign_flip_distribution():
    rng = random.Random(8)
    values = [rng.randint(1, 3000) for _ in range(300)]
    sums = inference._drawn_sums(values, 40_000, seed=1)
    mean, variance = sum(values) / 2, sum(v * v for v in values) / 4
    assert abs(sums.mean() - mean) < 4 * math.sqrt(variance / 40_000)
    assert sums.var() == pytest.approx(variance, rel=0.03)
    assert sums.min() >= 0 and sums.max() <= sum(values)


def test_nothing_to_compare_is_none_not_zero():
    assert inference.difference_interval([(1, 1)], [(0, 0)], [0]) is None
    assert inference.sign_flip_p([(1, 1)], [(0, 0)], [0]) is None
    assert inference.rate_interval([(0, 0)], [0]) is None


def test_the_detectable_effect_follows_the_t_quantiles():
    assert inference.detectable_effect(0.05, 30) == pytest.approx(
        (scipy_stats.t.ppf(0.975, 29) + scipy_stats.t.ppf(0.8, 29)) * 0.05
    )


# --- seeded simulations ------------------------------------------------------------------------------
# 1,000 replicates per design: a share near 95% moves by 0.7 points (one standard error).

GRID = [(clusters, repeats) for clusters in (10, 30, 100) for repeats in (1, 3)]


@pytest.mark.parametrize(("clusters", "repeats"), GRID)
def test_intervals_cover_at_least_94_percent_from_ten_clusters(clusters, repeats):
    for design in (Design(clusters, repeats, 2, 2, shift=0.8), Design(clusters, repeats, 4, 1, shift=-0.6)):
        result = validity(design, 1000, seed=clusters * 10 + repeats)
        assert result.rate_coverage >= 0.94, result
        assert result.delta_coverage >= 0.94, result


@pytest.mark.parametrize(("clusters", "repeats"), GRID)
def test_identical_variants_are_called_different_at_most_alpha_of_the_time(clusters, repeats):
    result = validity(Design(clusters, repeats, 2, 2), 1000, seed=7 + clusters + repeats)
    assert result.rejected <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / 1000), result


def test_a_dataset_task_of_200_rows_is_200_units_through_compare():
    rng = np.random.default_rng(5)
    false_positives = 0
    for _ in range(200):
        result = compare.compare(comparison_data(Design(200, 1), rng, rows=True))
        base, new = result.arms
        assert base.units == 200 and 0.02 < base.high - base.low < 0.3
        false_positives += new.versus.p_holm < 0.05
    assert false_positives / 200 <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / 200)


def test_informative_errors_are_flagged_through_compare():
    """An identical variant that turns half of its fails into infrastructure errors looks better;
    the comparison says its error share differs and gives Δ with errors as fails."""
    rng = np.random.default_rng(6)
    flagged = 0
    for _ in range(100):
        result = compare.compare(comparison_data(Design(30, 3, error_share=0.5), rng))
        versus = result.arms[1].versus
        if versus.errors_differ:
            flagged += 1
            assert any("infrastructure errors" in note for note in result.warnings)
            assert versus.delta_if_errors_fail < versus.delta
    assert flagged >= 95
