"""Planning on the comparison's own test: the formula it starts from, the designs it refuses, the
simulated power it promises (checked through the real compare()), and its words."""

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from runs_app.analysis.stats import compare, planning
from runs_app.analysis.stats.simulation import Design, comparison_data, planned_data


def real_power(units, repeats, compared, model, effect, replicates, seed=1) -> float:
    """How often the real compare() calls the variant better, on runs drawn as the planner draws them."""
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(replicates):
        versus = compare.compare(planned_data(units, repeats, compared, model, effect, rng)).arm("new").versus
        hits += versus.p_holm is not None and versus.p_holm < 0.05 and versus.delta > 0
    return hits / replicates


def test_the_formula_is_the_t_formula_over_the_unit_variance_with_holm():
    model = planning.VarianceModel(0.2, 0.01, "test")
    got = planning.formula_effect(40, 3, model, compared=2)
    quantiles = scipy_stats.t.ppf(1 - 0.05 / 4, 39) + scipy_stats.t.ppf(0.8, 39)
    assert got == pytest.approx(quantiles * np.sqrt((0.01 + 2 * 0.2 / 3) / 40))


@pytest.mark.parametrize(("compared", "fewest"), [(1, 6), (2, 7), (3, 7), (5, 8)])
def test_it_knows_the_fewest_units_that_can_show_anything(compared, fewest):
    assert planning.min_units(0.05, compared) == fewest
    assert compared * 2.0 ** (1 - fewest) < 0.05 <= compared * 2.0 ** (2 - fewest)


def test_it_refuses_a_design_no_result_of_which_can_be_significant():
    """5 units × 28 repeats: the old formula promised 20 pp; the sign-flip test's p is never
    below 2/2^5, so its power is exactly 0."""
    plan = planning.plan(5, 28)
    assert plan.refused and plan.detectable is None
    (line,) = plan.lines()
    assert line.startswith("5 units × 28 repeats per variant: cannot show any difference")
    assert "2/2^5 = 0.0625" in line and "At least 6 units are needed" in line
    assert real_power(5, 28, 1, planning.ASSUMED, 0.5, 30) == 0.0


def test_a_design_that_can_reach_no_effect_is_refused_in_words():
    plan = planning.plan(6, 3)
    assert plan.refused and not plan.refusal and plan.detectable is None
    assert "detects no effect" in plan.lines()[0] and "Add tasks" in plan.lines()[0]


def test_at_its_detectable_effect_the_real_comparison_has_the_planned_power():
    """The claim of a plan, through compare(): a run at the plan's detectable effect is called
    better about 80% of the time, with Holm over the experiment's variants."""
    plan = planning.plan(40, 3, compared=2)
    assert plan.detectable is not None and not plan.refused
    assert plan.detectable > planning.formula_effect(40, 3, planning.ASSUMED, compared=2) * 0.9
    got = real_power(40, 3, 2, planning.ASSUMED, plan.detectable, 200)
    assert 0.8 - 3 * math.sqrt(0.16 / 200) <= got <= 0.95, got


def test_a_sparse_effect_on_deterministic_tasks_is_planned_on_the_real_test():
    flips = planning.VarianceModel(0.0, 0.15 * 0.85, "as sparse as can be", 0.4)
    share, size = planning.laid_effect(0.15, flips)
    assert size == 1.0 and share == pytest.approx(0.15 / 0.6)  # whole failing tasks flip
    model = planning.VarianceModel(0.0, 0.05, "a pilot of deterministic tasks", 0.4)
    plan = planning.plan(30, 3, model)
    got = real_power(30, 3, 1, model, plan.detectable, 200, seed=2)
    assert 0.8 - 3 * math.sqrt(0.16 / 200) <= got <= 0.95, got


def test_its_effect_has_the_mean_and_spread_of_the_model():
    model = planning.VarianceModel(0.1, 0.01, "spread", 0.3)
    rng = np.random.default_rng(1)
    p = planning.difficulties(model, (400_000,), rng)
    assert p.mean() == pytest.approx(0.3, abs=0.002) and (p * (1 - p)).mean() == pytest.approx(0.1, abs=0.002)
    share, size = planning.laid_effect(0.1, model)
    gains = size * (1 - p) * (rng.random(len(p)) < share)
    assert gains.mean() == pytest.approx(0.1, abs=0.002) and gains.var() == pytest.approx(0.01, abs=0.001)


def test_repeats_cannot_beat_the_floor_nor_the_spread_of_the_effect():
    repeats, why = planning.repeats_needed(0.1, 24, planning.ASSUMED)
    assert repeats is None and "no Δ under 14.2 pp can be significant" in why
    spread = planning.VarianceModel(0.2, 0.1, "spread")
    repeats, why = planning.repeats_needed(0.15, 30, spread)
    assert repeats is None and "spread across tasks" in why
    steady = planning.VarianceModel(0.0, 0.05, "deterministic", 0.4)
    repeats, why = planning.repeats_needed(0.2, 20, steady)
    assert repeats is None and "behave the same on every try" in why


def test_more_units_or_repeats_reach_what_the_plan_says_they_reach():
    units = planning.units_needed(0.2, 3, planning.ASSUMED)
    assert planning.simulated_power(units, 3, 1, planning.ASSUMED, 0.2) >= 0.8
    assert planning.simulated_power(units - 5, 3, 1, planning.ASSUMED, 0.2) < 0.8
    repeats, _ = planning.repeats_needed(0.15, 60, planning.ASSUMED)
    assert planning.simulated_power(60, repeats, 1, planning.ASSUMED, 0.15) >= 0.8


def test_a_plan_explains_its_terms_in_words():
    lines = planning.plan(24, 3).lines()
    assert lines[0].startswith("24 units × 3 repeats per variant: detects |Δ| ≥ ")
    assert "simulated through the comparison's own test" in lines[0]
    assert "w = 0.200, how much a task's outcome varies from try to try" in lines[1]
    assert "τ² = 0.0000, how unevenly a change lands across tasks" in lines[1]
    assert lines[2].startswith("Design effect: at 3 repeats, trial noise (2w/r = 0.133)")
    assert [line.split(":")[0] for line in lines[3:]] == [f"To detect {e} pp" for e in (5, 10, 20)]
    steady = planning.plan(30, 3, planning.VarianceModel(0.0, 0.05, "a pilot", 0.4)).lines()
    assert any("repeats add nothing; only more tasks" in line for line in steady)


def test_a_pilot_gives_its_own_rate_and_variances():
    rng = np.random.default_rng(8)
    data = comparison_data(Design(300, 4, 2, 2, shift=0.5), rng)
    model = planning.pilot_model(data, "base", "from run #1")
    # Beta(2, 2): E[p(1 - p)] = 0.25 - 0.05 = 0.2 (the variant's is a little lower).
    assert model.within == pytest.approx(0.19, abs=0.02) and model.rate == pytest.approx(0.5, abs=0.04)
    assert model.source == "from run #1"
    one_repeat = planning.pilot_model(comparison_data(Design(300, 1), rng), "base", "pilot")
    assert one_repeat.between == 0.0 and one_repeat.within == pytest.approx(0.2, abs=0.04)
    assert "one repeat" in one_repeat.source
