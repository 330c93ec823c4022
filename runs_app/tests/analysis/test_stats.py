"""Tests of runs_app.analysis.stats: published values, edge cases, properties, and (dev requirements only)
agreement with statsmodels, scipy and numpy on random inputs."""

import math
import random
import statistics
from fractions import Fraction

import pytest

from runs_app.analysis import stats

# --- Wilson -----------------------------------------------------------------------------------


def test_it_gives_the_published_wilson_intervals():
    # Newcombe (1998), "Two-sided confidence intervals for the single proportion: comparison of
    # seven methods", Statistics in Medicine 17, 857-872: method 3 (score, no correction).
    assert stats.wilson_interval(81, 263) == pytest.approx((0.2553, 0.3662), abs=5e-5)
    assert stats.wilson_interval(15, 148) == pytest.approx((0.0624, 0.1605), abs=5e-5)
    assert stats.wilson_interval(0, 20) == pytest.approx((0.0, 0.1611), abs=5e-5)
    assert stats.wilson_interval(1, 29) == pytest.approx((0.0061, 0.1718), abs=5e-5)


def test_it_gives_the_textbook_wilson_intervals_for_ten_trials():
    # At 0/n the upper bound is z²/(n + z²) = 3.8415/13.8415; 10/10 mirrors it.
    assert stats.wilson_interval(8, 10) == pytest.approx((0.4902, 0.9433), abs=5e-5)
    assert stats.wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=5e-5)
    assert stats.wilson_interval(10, 10) == pytest.approx((0.7225, 1.0), abs=5e-5)


def test_it_pins_the_bounds_at_zero_and_one_exactly():
    assert stats.wilson_interval(0, 7)[0] == 0.0
    assert stats.wilson_interval(7, 7)[1] == 1.0


def test_it_returns_the_uninformative_interval_without_trials():
    assert stats.wilson_interval(0, 0) == (0.0, 1.0)


def test_it_widens_the_wilson_interval_with_confidence_and_narrows_it_with_trials():
    low90, high90 = stats.wilson_interval(30, 100, confidence=0.90)
    low99, high99 = stats.wilson_interval(30, 100, confidence=0.99)
    low_big, high_big = stats.wilson_interval(300, 1000)
    assert low99 < low90 < 0.3 < high90 < high99
    assert high_big - low_big < high90 - low90


@pytest.mark.parametrize(
    ("successes", "n", "confidence"), [(11, 10, 0.95), (-1, 10, 0.95), (1, 10, 1.0), (1, 10, 0.0)]
)
def test_it_rejects_impossible_wilson_arguments(successes, n, confidence):
    with pytest.raises(ValueError):
        stats.wilson_interval(successes, n, confidence)


# --- cluster bootstrap ------------------------------------------------------------------------


def _random_counts(rng: random.Random, tasks: int, repeats: int) -> list[tuple[int, int]]:
    # Tasks of varied difficulty, so repeats of one task are correlated as in real runs.
    return [(sum(rng.random() < rng.random() for _ in range(repeats)), repeats) for _ in range(tasks)]


def test_it_pools_passes_over_trials_for_the_estimate():
    estimate, low, high = stats.cluster_bootstrap_pass_rate(
        {"a": [True, True, False], "b": [False], "c": []}, iterations=200
    )
    assert estimate == 0.5
    assert 0.0 <= low <= estimate <= high <= 1.0


def test_it_accepts_outcome_lists_or_pass_counts_alike():
    outcomes = {"a": [True, True, False], "b": [False, False, False], "c": [True, True, True]}
    counts = [(2, 3), (0, 3), (3, 3)]
    assert stats.cluster_bootstrap_pass_rate(outcomes, iterations=300) == (
        stats.cluster_bootstrap_pass_rate(counts, iterations=300)
    )


def test_it_reproduces_the_cluster_bootstrap_from_its_seed_whatever_the_input_order():
    counts = _random_counts(random.Random(1), tasks=200, repeats=5)
    shuffled = counts[:]
    random.Random(2).shuffle(shuffled)
    first = stats.cluster_bootstrap_pass_rate(counts, seed=7, iterations=500)
    assert stats.cluster_bootstrap_pass_rate(shuffled, seed=7, iterations=500) == first
    assert stats.cluster_bootstrap_pass_rate(counts, seed=8, iterations=500) != first


def test_it_gives_degenerate_intervals_when_every_trial_agrees():
    assert stats.cluster_bootstrap_pass_rate([(5, 5)] * 20, iterations=100) == (1.0, 1.0, 1.0)
    assert stats.cluster_bootstrap_pass_rate([(0, 5)] * 20, iterations=100) == (0.0, 0.0, 0.0)


def test_it_ignores_tasks_without_trials_and_returns_the_uninformative_interval_for_none():
    assert stats.cluster_bootstrap_pass_rate([]) == (0.0, 0.0, 1.0)
    assert stats.cluster_bootstrap_pass_rate([(0, 0), (0, 0)]) == (0.0, 0.0, 1.0)
    with_empty = stats.cluster_bootstrap_pass_rate([(3, 4), (0, 0), (1, 4)], iterations=200)
    assert with_empty == stats.cluster_bootstrap_pass_rate([(3, 4), (1, 4)], iterations=200)


def test_it_matches_the_cluster_robust_standard_error():
    counts = _random_counts(random.Random(3), tasks=400, repeats=4)
    estimate, low, high = stats.cluster_bootstrap_pass_rate(counts, iterations=2000)
    # Delta-method (cluster-robust) standard error of a ratio estimator Σk / Σn.
    total_n = sum(n for _, n in counts)
    residuals = [k - estimate * n for k, n in counts]
    standard_error = math.sqrt(sum(r * r for r in residuals)) / total_n
    assert (high - low) / 2 == pytest.approx(1.96 * standard_error, rel=0.12)


def test_it_is_wider_than_a_trial_level_interval_when_repeats_agree():
    # Each task passes all or none of its 10 repeats: the information is 100 tasks, not 1,000
    # trials, so a Wilson interval on the pooled trials would be far too narrow.
    counts = [(10, 10)] * 50 + [(0, 10)] * 50
    _, low, high = stats.cluster_bootstrap_pass_rate(counts, iterations=1000)
    wilson_low, wilson_high = stats.wilson_interval(500, 1000)
    assert high - low > 2.5 * (wilson_high - wilson_low)


def test_it_rejects_bad_bootstrap_arguments():
    with pytest.raises(ValueError):
        stats.cluster_bootstrap_pass_rate([(3, 2)])
    with pytest.raises(ValueError):
        stats.cluster_bootstrap_pass_rate([(1, 2)], iterations=0)
    with pytest.raises(ValueError):
        stats.cluster_bootstrap_pass_rate([(1, 2)], confidence=1.5)


# --- pass@k and pass^k ------------------------------------------------------------------------


def _codex_pass_at_k(n: int, c: int, k: int) -> float:
    # The product form of the codex paper (Chen et al. 2021, fig. 3), as an independent check.
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def test_it_computes_pass_at_k_by_hand():
    assert stats.pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)
    assert stats.pass_at_k(10, 1, 1) == pytest.approx(0.1)
    assert stats.pass_at_k(10, 1, 10) == 1.0
    assert stats.pass_at_k(10, 0, 5) == 0.0
    assert stats.pass_at_k(10, 10, 3) == 1.0
    assert stats.pass_at_k(200, 13, 100) == pytest.approx(1 - math.comb(187, 100) / math.comb(200, 100))


def test_it_agrees_with_the_codex_product_form():
    rng = random.Random(4)
    for _ in range(500):
        n = rng.randint(1, 200)
        c, k = rng.randint(0, n), rng.randint(1, n)
        assert stats.pass_at_k(n, c, k) == pytest.approx(_codex_pass_at_k(n, c, k), abs=1e-12)


def test_it_computes_pass_hat_k_by_hand():
    assert stats.pass_hat_k(5, 2, 2) == pytest.approx(1 / 10)
    assert stats.pass_hat_k(5, 1, 2) == 0.0
    assert stats.pass_hat_k(5, 5, 5) == 1.0
    assert stats.pass_hat_k(8, 3, 1) == pytest.approx(3 / 8)
    assert stats.pass_hat_k(10, 7, 3) == pytest.approx((7 * 6 * 5) / (10 * 9 * 8))


@pytest.mark.parametrize("estimator", [stats.pass_at_k, stats.pass_hat_k])
@pytest.mark.parametrize(("n", "c", "k"), [(3, 1, 4), (0, 0, 1), (5, 2, 0), (5, 6, 1), (5, -1, 1)])
def test_it_rejects_undefined_pass_k_arguments(estimator, n, c, k):
    with pytest.raises(ValueError):
        estimator(n, c, k)


def test_it_averages_pass_k_over_tasks_up_to_the_smallest_repeat_count():
    per_task = [(1, 3), (3, 3), (0, 2), (0, 0)]
    at_k = stats.pass_at_k_curve(per_task)
    hat_k = stats.pass_hat_k_curve(per_task)
    assert list(at_k) == [1, 2]
    assert at_k[1] == pytest.approx((1 / 3 + 1 + 0) / 3)
    assert at_k[2] == pytest.approx((2 / 3 + 1 + 0) / 3)
    assert hat_k[2] == pytest.approx((0 + 1 + 0) / 3)
    assert stats.pass_at_k_curve([]) == {}
    assert stats.pass_hat_k_curve([(0, 0)]) == {}


def test_it_makes_pass_at_k_rise_and_pass_hat_k_fall_with_k():
    per_task = _random_counts(random.Random(5), tasks=50, repeats=10)
    at_k = list(stats.pass_at_k_curve(per_task).values())
    hat_k = list(stats.pass_hat_k_curve(per_task).values())
    assert at_k[0] == pytest.approx(hat_k[0])
    assert all(a <= b for a, b in zip(at_k, at_k[1:], strict=False))
    assert all(a >= b for a, b in zip(hat_k, hat_k[1:], strict=False))


# --- McNemar ----------------------------------------------------------------------------------


def test_it_gives_exact_mcnemar_p_values():
    assert stats.mcnemar_exact(1, 7) == Fraction(2 * (1 + 8), 2**8)
    # Cavo et al. (2012) in Fagerland, Lydersen & Laake (2013): exact conditional p = 0.052.
    assert stats.mcnemar_exact(6, 16) == pytest.approx(0.0525, abs=5e-5)
    assert stats.mcnemar_exact(0, 20) == 2 / 2**20


def test_it_gives_p_one_without_a_difference():
    assert stats.mcnemar_exact(0, 0) == 1.0
    assert stats.mcnemar_exact(9, 9) == 1.0
    assert stats.mcnemar_exact(4, 5) == 1.0


def test_it_treats_both_discordant_directions_alike():
    assert stats.mcnemar_exact(3, 12) == stats.mcnemar_exact(12, 3)


def test_it_rejects_negative_discordant_counts():
    with pytest.raises(ValueError):
        stats.mcnemar_exact(-1, 3)


# --- paired bootstrap -------------------------------------------------------------------------


def _arms(
    seed: int, tasks: int, shift: float
) -> tuple[dict[str, tuple[int, int]], dict[str, tuple[int, int]]]:
    rng = random.Random(seed)
    baseline, variant = {}, {}
    for index in range(tasks):
        difficulty = rng.random()
        easier = min(1.0, max(0.0, difficulty + shift + rng.gauss(0, 0.1)))
        baseline[f"t{index}"] = (sum(rng.random() < difficulty for _ in range(5)), 5)
        variant[f"t{index}"] = (sum(rng.random() < easier for _ in range(5)), 5)
    return baseline, variant


def test_it_gives_p_one_and_a_zero_delta_for_identical_arms():
    baseline, _ = _arms(6, tasks=100, shift=0.0)
    assert stats.paired_bootstrap(baseline, baseline, iterations=500) == (0.0, 0.0, 0.0, 1.0)


def test_it_detects_a_clear_improvement():
    baseline, variant = _arms(7, tasks=200, shift=0.15)
    result = stats.paired_bootstrap(baseline, variant, iterations=1000)
    assert 0.0 < result.low < result.delta < result.high
    assert result.p_value == pytest.approx(2 / 1001)


def test_it_mirrors_the_result_when_the_arms_swap():
    baseline, variant = _arms(8, tasks=150, shift=0.05)
    forward = stats.paired_bootstrap(baseline, variant, iterations=800)
    backward = stats.paired_bootstrap(variant, baseline, iterations=800)
    assert backward.delta == pytest.approx(-forward.delta)
    assert backward.low == pytest.approx(-forward.high)
    assert backward.high == pytest.approx(-forward.low)
    assert backward.p_value == pytest.approx(forward.p_value)


def test_it_agrees_with_the_normal_approximation():
    baseline, variant = _arms(9, tasks=400, shift=0.02)
    result = stats.paired_bootstrap(baseline, variant, iterations=2000)
    diffs = [variant[t][0] / variant[t][1] - baseline[t][0] / baseline[t][1] for t in baseline]
    standard_error = statistics.stdev(diffs) / math.sqrt(len(diffs))
    assert result.delta == pytest.approx(statistics.fmean(diffs))
    assert (result.high - result.low) / 2 == pytest.approx(1.96 * standard_error, rel=0.12)
    normal_p = 2 * (1 - statistics.NormalDist().cdf(abs(result.delta) / standard_error))
    assert result.p_value == pytest.approx(normal_p, abs=0.03)


def test_it_pairs_only_tasks_both_arms_ran():
    baseline = {"a": (1, 2), "b": (0, 2), "only_baseline": (2, 2), "errored": (0, 0)}
    variant = {"a": (2, 2), "b": (1, 2), "only_variant": (0, 2), "errored": (1, 1)}
    assert stats.paired_bootstrap(baseline, variant, iterations=200).delta == 0.5
    assert stats.paired_bootstrap({"x": (1, 1)}, {"y": (1, 1)}) == (0.0, -1.0, 1.0, 1.0)


def test_it_reproduces_the_paired_bootstrap_from_its_seed_whatever_the_input_order():
    baseline, variant = _arms(10, tasks=100, shift=0.03)
    reordered = dict(reversed(list(variant.items())))
    first = stats.paired_bootstrap(baseline, variant, seed=3, iterations=500)
    assert stats.paired_bootstrap(baseline, reordered, seed=3, iterations=500) == first
    assert stats.paired_bootstrap(baseline, variant, seed=4, iterations=500) != first


# --- Newcombe paired interval -----------------------------------------------------------------


def test_it_gives_newcombes_paired_interval_for_the_published_example():
    # Cavo et al. (2012): 59 both, 6 before only, 16 after only, 80 neither. Fagerland et al.
    # report Δ = -0.0621 with a 95% interval -0.1186 to -0.0046.
    delta, low, high = stats.newcombe_paired_interval(59, 6, 16, 80)
    assert (delta, low, high) == pytest.approx((-0.0621, -0.1186, -0.0046), abs=5e-5)


def test_it_builds_the_paired_table_from_one_repeat():
    pairs = [(True, True)] * 59 + [(False, True)] * 6 + [(True, False)] * 16 + [(False, False)] * 80
    random.Random(11).shuffle(pairs)
    assert stats.paired_delta_interval_one_repeat(pairs) == stats.newcombe_paired_interval(59, 6, 16, 80)


def test_it_keeps_the_paired_interval_inside_its_range_and_around_the_estimate():
    rng = random.Random(12)
    for _ in range(300):
        cells = [rng.randint(0, 12) for _ in range(4)]
        if sum(cells) == 0:
            continue
        delta, low, high = stats.newcombe_paired_interval(*cells)
        assert -1.0 <= low <= delta <= high <= 1.0
        both, variant_only, baseline_only, neither = cells
        mirrored = stats.newcombe_paired_interval(both, baseline_only, variant_only, neither)
        assert mirrored == pytest.approx((-delta, -high, -low))


def test_it_gives_the_uninformative_paired_interval_without_pairs():
    assert stats.paired_delta_interval_one_repeat([]) == (0.0, -1.0, 1.0)


def test_it_reaches_the_edge_when_every_pair_improved():
    delta, low, high = stats.newcombe_paired_interval(0, 10, 0, 0)
    assert delta == 1.0
    assert high == 1.0
    assert 0.5 < low < 1.0


# --- Holm -------------------------------------------------------------------------------------


def test_it_adjusts_a_known_vector_by_holm():
    # Sorted: 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 → raised to 0.06.
    adjusted = stats.holm([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])


def test_it_caps_holm_at_one_and_handles_no_p_values():
    assert stats.holm([0.5, 0.9, 0.3]) == pytest.approx([1.0, 1.0, 0.9])
    assert stats.holm([]) == []
    assert stats.holm([0.2]) == [0.2]


def test_it_rejects_p_values_outside_zero_and_one():
    with pytest.raises(ValueError):
        stats.holm([0.1, 1.2])
    with pytest.raises(ValueError):
        stats.holm([float("nan")])


# --- quantile ---------------------------------------------------------------------------------


def test_it_interpolates_quantiles_like_the_inclusive_method():
    values = sorted(random.Random(13).random() for _ in range(101))
    expected = statistics.quantiles(values, n=40, method="inclusive")
    assert [stats.quantile(values, i / 40) for i in range(1, 40)] == pytest.approx(expected)
    assert stats.quantile([2.0], 0.3) == 2.0
    with pytest.raises(ValueError):
        stats.quantile([], 0.5)


# --- against statsmodels / scipy / numpy (dev requirements only) -------------------------------


def test_it_matches_statsmodels_wilson():
    proportion = pytest.importorskip("statsmodels.stats.proportion")
    rng = random.Random(20)
    for _ in range(300):
        n = rng.randint(1, 500)
        successes, confidence = rng.randint(0, n), rng.choice([0.8, 0.9, 0.95, 0.99])
        expected = proportion.proportion_confint(successes, n, alpha=1 - confidence, method="wilson")
        assert stats.wilson_interval(successes, n, confidence) == pytest.approx(expected, abs=1e-12)


def test_it_matches_statsmodels_exact_mcnemar():
    contingency_tables = pytest.importorskip("statsmodels.stats.contingency_tables")
    rng = random.Random(21)
    for _ in range(300):
        both, b, c, neither = (rng.randint(0, 60) for _ in range(4))
        table = [[both, b], [c, neither]]
        expected = contingency_tables.mcnemar(table, exact=True).pvalue
        assert stats.mcnemar_exact(b, c) == pytest.approx(expected, rel=1e-9, abs=1e-15)


def test_it_matches_statsmodels_holm():
    multitest = pytest.importorskip("statsmodels.stats.multitest")
    rng = random.Random(22)
    # multipletests costs ~25 ms a call here: a few dozen vectors keep the test under a second.
    for _ in range(30):
        p_values = [rng.choice([rng.random(), rng.random() / 50, 0.04]) for _ in range(rng.randint(1, 12))]
        expected = multitest.multipletests(p_values, method="holm")[1]
        assert stats.holm(p_values) == pytest.approx(list(expected), abs=1e-12)


def test_it_matches_scipy_binomials_for_pass_k():
    special = pytest.importorskip("scipy.special")
    rng = random.Random(23)
    for _ in range(300):
        n = rng.randint(1, 300)
        c, k = rng.randint(0, n), rng.randint(1, n)
        total = special.comb(n, k, exact=True)
        expected_at = 1 - special.comb(n - c, k, exact=True) / total
        assert stats.pass_at_k(n, c, k) == pytest.approx(expected_at, abs=1e-12)
        assert stats.pass_hat_k(n, c, k) == pytest.approx(special.comb(c, k, exact=True) / total, abs=1e-12)


def test_it_matches_scipys_percentile_bootstrap():
    scipy_stats = pytest.importorskip("scipy.stats")
    numpy = pytest.importorskip("numpy")
    counts = _random_counts(random.Random(24), tasks=300, repeats=6)
    passes = numpy.array([k for k, _ in counts])
    trials = numpy.array([n for _, n in counts])

    def pooled(k, n, axis):
        return k.sum(axis=axis) / n.sum(axis=axis)

    expected = scipy_stats.bootstrap(
        (passes, trials), pooled, paired=True, n_resamples=4000, method="percentile", rng=1
    ).confidence_interval
    _, low, high = stats.cluster_bootstrap_pass_rate(counts, iterations=4000)
    # Two Monte Carlo estimates of the same quantiles (standard error ≈ 0.02): within 0.004.
    assert (low, high) == pytest.approx((expected.low, expected.high), abs=0.004)


def test_it_matches_numpy_quantiles():
    numpy = pytest.importorskip("numpy")
    rng = random.Random(25)
    values = sorted(rng.gauss(0, 1) for _ in range(257))
    for q in (0.0, 0.025, 0.5, 0.975, 1.0, rng.random()):
        assert stats.quantile(values, q) == pytest.approx(float(numpy.quantile(values, q)), abs=1e-12)
