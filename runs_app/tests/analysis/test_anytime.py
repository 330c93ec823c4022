"""Anytime-valid intervals (confidence sequences) and the decision a live run may stop on."""

import numpy as np
import pytest

from runs_app.analysis.stats import compare, inference, notes
from runs_app.analysis.stats.simulation import Design, comparison_data


def test_a_sequence_starts_as_everything_and_never_widens():
    assert inference.confidence_sequence([]) == (-1.0, 1.0)
    rng = np.random.default_rng(2)
    values = list(rng.choice([-1.0, 0.0, 1.0], size=200, p=[0.1, 0.6, 0.3]))
    bounds = [inference.confidence_sequence(values[:n]) for n in range(1, 201, 10)]
    lows, highs = [low for low, _ in bounds], [high for _, high in bounds]
    # (to the bisection's precision)
    assert all(later >= earlier - 1e-9 for earlier, later in zip(lows, lows[1:], strict=False))
    assert all(later <= earlier + 1e-9 for earlier, later in zip(highs, highs[1:], strict=False))
    assert bounds[-1][0] < np.mean(values) < bounds[-1][1]


def test_it_is_wider_than_the_fixed_sample_interval():
    rng = np.random.default_rng(3)
    units = [(int(k), 3) for k in rng.binomial(3, 0.6, 60)]
    fixed = inference.rate_interval(units, range(60))
    low, high = inference.confidence_sequence([2 * p / n - 1 for p, n in units])
    assert (low + 1) / 2 < fixed.low and (high + 1) / 2 > fixed.high


@pytest.mark.parametrize(
    ("low", "high", "decided"),
    [(0.01, 0.3, "better"), (-0.3, -0.01, "worse"), (-0.04, 0.2, "not worse"), (-0.2, 0.2, "")],
)
def test_a_decision_reads_the_interval_against_zero_and_the_margin(low, high, decided):
    assert compare.decision(low, high, margin=0.05) == decided


def test_a_clear_difference_is_decided_and_said_in_words():
    rng = np.random.default_rng(4)
    result = compare.compare(comparison_data(Design(40, 3, 1, 4, shift=4.0), rng))
    new = result.arms[1]
    assert new.versus.cs_units == 40 and new.versus.decided == "better"
    assert new.versus.cs_low > 0 and new.versus.cs_low < new.versus.low  # wider than the final
    words = notes.anytime_words(new, "base", result.confidence)
    assert words.startswith("new: pass rate in [") and "decided: better than base" in words
    assert "(40 paired units)" in words


def test_identical_arms_stay_undecided():
    rng = np.random.default_rng(5)
    result = compare.compare(comparison_data(Design(20, 1), rng))
    assert result.arms[1].versus.decided == ""
    assert "undecided: keep it running" in notes.anytime_words(result.arms[1], "base", 0.95)
