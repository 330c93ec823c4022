"""Planning: the detectable effect, the units and repeats an effect needs, the pilot's variance,
and the claim behind them (a run at its detectable effect rejects about 80% of the time)."""

import numpy as np
import pytest
from scipy import stats as scipy_stats

from runs_app.analysis.stats import planning
from runs_app.analysis.stats.simulation import Design, comparison_data, true_values, validity


def test_the_detectable_effect_is_the_t_formula_over_the_unit_variance():
    model = planning.VarianceModel(0.2, 0.01, "test")
    got = planning.detectable_effect(40, 3, model)
    quantiles = scipy_stats.t.ppf(0.975, 39) + scipy_stats.t.ppf(0.8, 39)
    assert got == pytest.approx(quantiles * np.sqrt((0.01 + 2 * 0.2 / 3) / 40))


def test_units_and_repeats_needed_invert_the_detectable_effect():
    model = planning.ASSUMED
    units = planning.units_needed(0.1, 3, model)
    assert (
        planning.detectable_effect(units, 3, model) <= 0.1 < planning.detectable_effect(units - 1, 3, model)
    )
    repeats = planning.repeats_needed(0.1, 50, model)
    assert (
        planning.detectable_effect(50, repeats, model)
        <= 0.1
        < planning.detectable_effect(50, repeats - 1, model)
    )


def test_repeats_cannot_beat_the_spread_of_the_effect_across_units():
    model = planning.VarianceModel(0.2, 0.05, "spread")
    # With τ² = 0.05 and 10 units, even infinitely many repeats leave the detectable effect
    # at (t + t)·√(0.05/10) ≈ 0.22.
    assert planning.repeats_needed(0.1, 10, model) is None
    assert planning.repeats_needed(0.3, 10, model) is not None


def test_a_plan_says_what_it_assumes_and_what_each_effect_needs():
    plan = planning.plan(24, 3)
    lines = plan.lines()
    assert lines[0].startswith("24 units × 3 repeats per variant: detects |Δ| ≥ ")
    assert "assumed: 50% pass rate" in lines[1]
    assert [effect for effect, _, _ in plan.needs] == [0.05, 0.10, 0.20]
    assert planning.plan(1, 3).lines() == [
        "1 unit × 3 repeats per variant: too few units to detect any effect (at least 2 are needed)."
    ]


def test_at_its_detectable_effect_a_design_has_about_the_planned_power():
    """The claim of the plan, in simulation: a run whose variant moves every task by the planned
    detectable effect rejects about 80% of the time (a constant shift, as the model assumes)."""
    units, repeats = 40, 3
    effect = planning.detectable_effect(units, repeats, planning.ASSUMED)
    shift = _logit_shift_for(effect, Design(units, repeats, 2, 2))
    result = validity(Design(units, repeats, 2, 2, shift=shift), 600, seed=3)
    assert result.true_delta == pytest.approx(effect, abs=0.005)
    assert 0.7 <= result.rejected <= 0.92, result


def test_a_pilot_gives_its_own_within_unit_variance():
    rng = np.random.default_rng(8)
    data = comparison_data(Design(300, 4, 2, 2, shift=0.5), rng)
    model = planning.pilot_model(data, "base", "from run #1")
    # Beta(2, 2): E[p(1 - p)] = 0.25 - 0.05 = 0.2 (the variant's is a little lower).
    assert model.within == pytest.approx(0.19, abs=0.02)
    assert model.source.startswith("from run #1: w = ")
    one_repeat = planning.pilot_model(comparison_data(Design(300, 1), rng), "base", "pilot")
    assert one_repeat.between == 0.0 and one_repeat.within == pytest.approx(0.2, abs=0.04)
    assert "one repeat" in one_repeat.source


def _logit_shift_for(effect: float, design: Design) -> float:
    low, high = 0.0, 3.0
    for _ in range(40):
        middle = (low + high) / 2
        if true_values(Design(design.clusters, design.repeats, design.a, design.b, shift=middle))[1] < effect:
            low = middle
        else:
            high = middle
    return (low + high) / 2
