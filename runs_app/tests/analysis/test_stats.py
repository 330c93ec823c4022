"""Tests of runs_app.analysis.stats.intervals: published values, edge cases, properties, and (dev
requirements only) agreement with statsmodels, scipy and numpy on random inputs."""

import importlib
import math
import random
from fractions import Fraction

import pytest
from scipy import stats as scipy_stats

from runs_app.analysis.stats import intervals


def _random_counts(rng: random.Random, tasks: int, repeats: int) -> list[tuple[int, int]]:
    return [(rng.randint(0, repeats), repeats) for _ in range(tasks)]


# --- Wilson -----------------------------------------------------------------------------------


def test_it_gives_the_published_wilson_intervals():
    # Newcombe (1998), "Two-sided confidence intervals for the single proportion: comparison of
    # seven methods", Statistics in Medicine 17, 857-872: method 3 (score, no correction).
    assert intervals.wilson_interval(81, 263) == pytest.approx((0.2553, 0.3662), abs=5e-5)
    assert intervals.wilson_interval(15, 148) == pytest.approx((0.0624, 0.1605), abs=5e-5)
    assert intervals.wilson_interval(0, 20) == pytest.approx((0.0, 0.1611), abs=5e-5)
    assert intervals.wilson_interval(1, 29) == pytest.approx((0.0061, 0.1718), abs=5e-5)


def test_it_gives_the_textbook_wilson_intervals_for_ten_trials():
    # At 0/n the upper bound is z²/(n + z²) = 3.8415/13.8415; 10/10 mirrors it.
    assert intervals.wilson_interval(8, 10) == pytest.approx((0.4902, 0.9433), abs=5e-5)
    assert intervals.wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=5e-5)
    assert intervals.wilson_interval(10, 10) == pytest.approx((0.7225, 1.0), abs=5e-5)


def test_it_pins_the_bounds_at_zero_and_one_exactly():
    assert intervals.wilson_interval(0, 7)[0] == 0.0
    assert intervals.wilson_interval(7, 7)[1] == 1.0


def test_it_returns_the_uninformative_interval_without_trials():
    assert intervals.wilson_interval(0, 0) == (0.0, 1.0)


def test_it_widens_the_wilson_interval_with_confidence_and_narrows_it_with_trials():
    low90, high90 = intervals.wilson_interval(30, 100, confidence=0.90)
    low99, high99 = intervals.wilson_interval(30, 100, confidence=0.99)
    low_big, high_big = intervals.wilson_interval(300, 1000)
    assert low99 < low90 < 0.3 < high90 < high99
    assert high_big - low_big < high90 - low90


@pytest.mark.parametrize(
    ("successes", "n", "confidence"), [(11, 10, 0.95), (-1, 10, 0.95), (1, 10, 1.0), (1, 10, 0.0)]
)
def test_it_rejects_impossible_wilson_arguments(successes, n, confidence):
    with pytest.raises(ValueError):
        intervals.wilson_interval(successes, n, confidence)


# --- pass@k and pass^k ------------------------------------------------------------------------


def _codex_pass_at_k(n: int, c: int, k: int) -> float:
    # The product form of the codex paper (Chen et al. 2021, fig. 3), as an independent check.
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def test_it_computes_pass_at_k_by_hand():
    assert intervals.pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)
    assert intervals.pass_at_k(10, 1, 1) == pytest.approx(0.1)
    assert intervals.pass_at_k(10, 1, 10) == 1.0
    assert intervals.pass_at_k(10, 0, 5) == 0.0
    assert intervals.pass_at_k(10, 10, 3) == 1.0
    assert intervals.pass_at_k(200, 13, 100) == pytest.approx(1 - math.comb(187, 100) / math.comb(200, 100))


def test_it_agrees_with_the_codex_product_form():
    rng = random.Random(4)
    for _ in range(500):
        n = rng.randint(1, 200)
        c, k = rng.randint(0, n), rng.randint(1, n)
        assert intervals.pass_at_k(n, c, k) == pytest.approx(_codex_pass_at_k(n, c, k), abs=1e-12)


def test_it_computes_pass_hat_k_by_hand():
    assert intervals.pass_hat_k(5, 2, 2) == pytest.approx(1 / 10)
    assert intervals.pass_hat_k(5, 1, 2) == 0.0
    assert intervals.pass_hat_k(5, 5, 5) == 1.0
    assert intervals.pass_hat_k(8, 3, 1) == pytest.approx(3 / 8)
    assert intervals.pass_hat_k(10, 7, 3) == pytest.approx((7 * 6 * 5) / (10 * 9 * 8))


@pytest.mark.parametrize("estimator", [intervals.pass_at_k, intervals.pass_hat_k])
@pytest.mark.parametrize(("n", "c", "k"), [(3, 1, 4), (0, 0, 1), (5, 2, 0), (5, 6, 1), (5, -1, 1)])
def test_it_rejects_undefined_pass_k_arguments(estimator, n, c, k):
    with pytest.raises(ValueError):
        estimator(n, c, k)


# --- McNemar ----------------------------------------------------------------------------------


def test_fishers_exact_test_matches_scipy():
    rng = random.Random(11)
    tables = [(0, 0, 0, 0), (3, 0, 0, 3), (0, 5, 5, 0), (10, 0, 0, 10), (1, 9, 11, 3)]
    tables += [tuple(rng.randint(0, rng.choice([2, 10, 40])) for _ in range(4)) for _ in range(400)]
    for a, b, c, d in tables:
        expected = scipy_stats.fisher_exact([[a, b], [c, d]]).pvalue
        assert intervals.fisher_exact_p(a, b, c, d) == pytest.approx(expected, abs=1e-12), (a, b, c, d)
    with pytest.raises(ValueError):
        intervals.fisher_exact_p(-1, 0, 0, 0)


def test_it_gives_exact_mcnemar_p_values():
    assert intervals.mcnemar_exact(1, 7) == Fraction(2 * (1 + 8), 2**8)
    # Cavo et al. (2012) in Fagerland, Lydersen & Laake (2013): exact conditional p = 0.052.
    assert intervals.mcnemar_exact(6, 16) == pytest.approx(0.0525, abs=5e-5)
    assert intervals.mcnemar_exact(0, 20) == 2 / 2**20


def test_it_gives_p_one_without_a_difference():
    assert intervals.mcnemar_exact(0, 0) == 1.0
    assert intervals.mcnemar_exact(9, 9) == 1.0
    assert intervals.mcnemar_exact(4, 5) == 1.0


def test_it_treats_both_discordant_directions_alike():
    assert intervals.mcnemar_exact(3, 12) == intervals.mcnemar_exact(12, 3)


def test_it_rejects_negative_discordant_counts():
    with pytest.raises(ValueError):
        intervals.mcnemar_exact(-1, 3)


# --- Newcombe paired interval -----------------------------------------------------------------


def test_it_gives_newcombes_paired_interval_for_the_published_example():
    # Cavo et al. (2012): 59 both, 6 before only, 16 after only, 80 neither. Fagerland et al.
    # report Δ = -0.0621 with a 95% interval -0.1186 to -0.0046.
    delta, low, high = intervals.newcombe_paired_interval(59, 6, 16, 80)
    assert (delta, low, high) == pytest.approx((-0.0621, -0.1186, -0.0046), abs=5e-5)


def test_it_keeps_the_paired_interval_inside_its_range_and_around_the_estimate():
    rng = random.Random(12)
    for _ in range(300):
        cells = [rng.randint(0, 12) for _ in range(4)]
        if sum(cells) == 0:
            continue
        delta, low, high = intervals.newcombe_paired_interval(*cells)
        assert -1.0 <= low <= delta <= high <= 1.0
        both, variant_only, baseline_only, neither = cells
        mirrored = intervals.newcombe_paired_interval(both, baseline_only, variant_only, neither)
        assert mirrored == pytest.approx((-delta, -high, -low))


def test_it_reaches_the_edge_when_every_pair_improved():
    delta, low, high = intervals.newcombe_paired_interval(0, 10, 0, 0)
    assert delta == 1.0
    assert high == 1.0
    assert 0.5 < low < 1.0


# --- Holm -------------------------------------------------------------------------------------


def test_it_adjusts_a_known_vector_by_holm():
    # Sorted: 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 → raised to 0.06.
    adjusted = intervals.holm([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])


def test_it_caps_holm_at_one_and_handles_no_p_values():
    assert intervals.holm([0.5, 0.9, 0.3]) == pytest.approx([1.0, 1.0, 0.9])
    assert intervals.holm([]) == []
    assert intervals.holm([0.2]) == [0.2]


def test_it_rejects_p_values_outside_zero_and_one():
    with pytest.raises(ValueError):
        intervals.holm([0.1, 1.2])
    with pytest.raises(ValueError):
        intervals.holm([float("nan")])


# --- quantile ---------------------------------------------------------------------------------


# --- against statsmodels / scipy / numpy (dev requirements only) -------------------------------


def test_it_matches_statsmodels_wilson():
    proportion = importlib.import_module("statsmodels.stats.proportion")
    rng = random.Random(20)
    for _ in range(300):
        n = rng.randint(1, 500)
        successes, confidence = rng.randint(0, n), rng.choice([0.8, 0.9, 0.95, 0.99])
        expected = proportion.proportion_confint(successes, n, alpha=1 - confidence, method="wilson")
        assert intervals.wilson_interval(successes, n, confidence) == pytest.approx(expected, abs=1e-12)


def test_it_matches_statsmodels_exact_mcnemar():
    contingency_tables = importlib.import_module("statsmodels.stats.contingency_tables")
    rng = random.Random(21)
    for _ in range(300):
        both, b, c, neither = (rng.randint(0, 60) for _ in range(4))
        table = [[both, b], [c, neither]]
        expected = contingency_tables.mcnemar(table, exact=True).pvalue
        assert intervals.mcnemar_exact(b, c) == pytest.approx(expected, rel=1e-9, abs=1e-15)


def test_it_matches_statsmodels_holm():
    multitest = importlib.import_module("statsmodels.stats.multitest")
    rng = random.Random(22)
    # multipletests costs ~25 ms a call here: a few dozen vectors keep the test under a second.
    for _ in range(30):
        p_values = [rng.choice([rng.random(), rng.random() / 50, 0.04]) for _ in range(rng.randint(1, 12))]
        expected = multitest.multipletests(p_values, method="holm")[1]
        assert intervals.holm(p_values) == pytest.approx(list(expected), abs=1e-12)


def test_it_matches_scipy_binomials_for_pass_k():
    special = importlib.import_module("scipy.special")
    rng = random.Random(23)
    for _ in range(300):
        n = rng.randint(1, 300)
        c, k = rng.randint(0, n), rng.randint(1, n)
        total = special.comb(n, k, exact=True)
        expected_at = 1 - special.comb(n - c, k, exact=True) / total
        assert intervals.pass_at_k(n, c, k) == pytest.approx(expected_at, abs=1e-12)
        assert intervals.pass_hat_k(n, c, k) == pytest.approx(
            special.comb(c, k, exact=True) / total, abs=1e-12
        )


def test_it_matches_scipys_continuity_corrected_wilson():
    for successes, n in [(0, 10), (3, 10), (10, 10), (17, 40), (1, 3)]:
        expected = scipy_stats.binomtest(successes, n).proportion_ci(method="wilsoncc")
        got = intervals.wilson_cc_interval(successes / n, n, 1.959963984540054)
        assert got == pytest.approx((expected.low, expected.high), abs=1e-12)
