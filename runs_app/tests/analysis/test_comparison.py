"""The comparison (load, compare), trial rows and charts on small synthetic runs, against
hand-computed values. The estimators themselves are checked against references and simulation
in test_inference."""

import hashlib
import math
from itertools import count

import plotly.graph_objects as go
import pytest
from django.urls import reverse

from experiments_app.models import Bundle, Experiment, Task, TaskVersion, Variant
from runs_app.analysis import exports, load, rollup
from runs_app.analysis.stats import charts, compare, inference, intervals, records
from runs_app.models import CriterionResult, Run, Trial

pytestmark = pytest.mark.django_db

STATUS = {
    "P": Trial.Status.PASSED,
    "F": Trial.Status.FAILED,
    "E": Trial.Status.ERROR,
    "C": Trial.Status.CANCELLED,
    "Q": Trial.Status.QUEUED,
    "R": Trial.Status.RUNNING,
}
# Per outcome: score, duration, input tokens, output tokens, cost. Grader errors keep a score.
DEFAULTS = {
    "P": (1.0, 10.0, 100, 10, 0.5),
    "F": (0.25, 10.0, 100, 10, 0.5),
    "E": (0.9, 1.0, 100, 10, 0.5),
}
_serial = count()


def make_experiment(slug: str = "exp", variants: tuple[str, ...] = ("base", "new")) -> Experiment:
    experiment = Experiment.objects.create(slug=slug)
    for position, name in enumerate(variants):
        Variant.objects.create(experiment=experiment, slug=name, position=position)
    return experiment


def task_version(slug: str, tags: tuple[str, ...] = (), content: str = "v1") -> TaskVersion:
    """The task's version holding `content`: a new content makes a new version (and bundle)."""
    digest = hashlib.sha256(f"{slug}/{content}".encode()).hexdigest()
    bundle, _ = Bundle.objects.get_or_create(digest=digest, defaults={"data": b"", "size": 0})
    task, _ = Task.objects.get_or_create(
        slug=slug, defaults={"tags": list(tags), "source_yaml": "", "bundle": bundle}
    )
    version = task.versions.filter(bundle=bundle).first()
    if version is None:
        number = task.versions.count() + 1
        version = TaskVersion.objects.create(
            task=task, number=number, spec={}, source_yaml="", yaml_path="task.yaml", bundle=bundle
        )
    return version


def make_run(
    experiment: Experiment,
    outcomes: dict[str, dict[str, str]],
    *,
    tags: dict[str, tuple[str, ...]] | None = None,
    content: dict[str, str] | None = None,
    fingerprint: str = "fp",
    baseline: str | None = None,
    status: str = Run.Status.FINISHED,
    **fields,
) -> Run:
    """A run whose trials have the given outcomes: {task: {variant: "PPF"}}, one letter a trial
    (P passed, F failed, E error, C cancelled, Q queued, R running). `fields` override trial
    fields as {field: {(task, variant, replicate): value}}."""
    run = Run.objects.create(
        experiment=experiment, status=status, config={"baseline": baseline} if baseline else {}
    )
    variants = {variant.slug: variant for variant in experiment.variants.all()}
    for task_slug, by_variant in outcomes.items():
        version = task_version(
            task_slug, (tags or {}).get(task_slug, ()), (content or {}).get(task_slug, "v1")
        )
        for variant_slug, letters in by_variant.items():
            for replicate, letter in enumerate(letters):
                score, duration, tokens_in, tokens_out, cost = DEFAULTS.get(letter, (None, None, 0, 0, 0.0))
                trial = Trial(
                    run=run,
                    task_version=version,
                    variant=variants[variant_slug],
                    replicate=replicate,
                    status=STATUS[letter],
                    config_fingerprint=f"{fingerprint}-{task_slug}-{variant_slug}",
                    score=score,
                    duration_seconds=duration,
                    input_tokens=tokens_in,
                    output_tokens=tokens_out,
                    cost_usd=cost,
                )
                for name, values in fields.items():
                    if (task_slug, variant_slug, replicate) in values:
                        setattr(trial, name, values[(task_slug, variant_slug, replicate)])
                trial.save()
    rollup.recount(run)
    return run


def arm(result: compare.Comparison, key: str) -> compare.ArmSummary:
    return next(a for a in result.arms if a.key == key)


# --- one repeat --------------------------------------------------------------------------------

ONE_REPEAT = {
    "t1": {"base": "P", "new": "P"},
    "t2": {"base": "P", "new": "F"},
    "t3": {"base": "F", "new": "P"},
    "t4": {"base": "F", "new": "P"},
    "t5": {"base": "P", "new": "P"},
    "t6": {"base": "E", "new": "P"},
}


def one_repeat_run() -> Run:
    durations = {(f"t{i}", "base", 0): float(10 * i) for i in range(1, 6)}
    return make_run(make_experiment(), ONE_REPEAT, baseline="base", duration_seconds=durations)


def test_it_counts_outcomes_and_leaves_infrastructure_errors_out_of_the_pass_rate():
    result = load.compare_runs([one_repeat_run()])
    base = arm(result, "base")
    assert (base.trials, base.passed, base.failed, base.errors) == (6, 3, 2, 1)
    assert base.pass_rate == pytest.approx(3 / 5)
    assert arm(result, "new").pass_rate == pytest.approx(5 / 6)


def test_it_gives_the_clustered_interval_of_inference_with_one_repeat():
    result = load.compare_runs([one_repeat_run()])
    base, new = arm(result, "base"), arm(result, "new")
    assert base.interval == "cluster-robust t over 5 clusters"
    expected = inference.rate_interval([(1, 1), (1, 1), (0, 1), (0, 1), (1, 1)], range(5))
    assert (base.pass_rate, base.low, base.high) == pytest.approx(expected[:3])
    # Five binary units: t(4) is wide; it reaches both ends here.
    assert (base.low, base.high) == (0.0, 1.0)
    assert new.low < 5 / 6 < new.high
    assert base.pass_at_k == {} and base.pass_hat_k == {}


def test_it_compares_over_paired_units_with_the_sign_flip_test():
    versus = arm(load.compare_runs([one_repeat_run()]), "new").versus
    # t6 has no graded baseline trial: 5 pairs; new only 2 (t3, t4), base only 1 (t2).
    assert versus.units == 5
    assert (versus.baseline_rate, versus.arm_rate) == pytest.approx((3 / 5, 4 / 5))
    assert versus.delta == pytest.approx(versus.arm_rate - versus.baseline_rate) == pytest.approx(0.2)
    assert versus.test == "sign-flip (exact), floored by the number of clusters"
    # With one repeat the sign-flip test is McNemar's exact test.
    assert versus.p_value == intervals.mcnemar_exact(2, 1) == 1.0 and versus.p_holm == 1.0
    # The floor five clusters set: an effect on a few tasks may be missing from five of them.
    reach = inference.unseen_effect(5, 0.05)
    assert versus.low <= 0.2 - reach and versus.high >= 0.2 + reach
    # The units that changed, read against what identical arms would show by chance: each
    # discordant unit (pooled rate 1/2) shows a change either way a quarter of the time.
    assert [d.unit for d in versus.improved] == ["t3", "t4"] and [d.unit for d in versus.regressed] == ["t2"]
    assert versus.improved_by_chance == versus.regressed_by_chance == pytest.approx(3 * 0.25)


def test_it_reports_score_duration_tokens_and_cost():
    base = arm(load.compare_runs([one_repeat_run()]), "base")
    assert base.mean_score == pytest.approx((3 * 1.0 + 2 * 0.25) / 5)  # the error's 0.9 left out
    assert base.median_duration == pytest.approx(30.0)  # 10..50; the error's 1 s left out
    assert base.tokens == 6 * 110
    assert base.cost == pytest.approx(3.0)
    assert base.cost_per_pass == pytest.approx(1.0)


def test_it_holm_adjusts_the_p_values_across_variants():
    experiment = make_experiment(variants=("base", "all", "half", "none"))
    outcomes = {
        f"t{i}": {"base": "F", "all": "P", "half": "P" if i < 4 else "F", "none": "F"} for i in range(8)
    }
    result = load.compare_runs([make_run(experiment, outcomes)])
    raw = [arm(result, key).versus.p_value for key in ("all", "half", "none")]
    # McNemar: 8 discordant of 8 -> 2/2^8; 4 of 4 -> 2/2^4; none -> 1.
    assert raw == pytest.approx([2 / 256, 2 / 16, 1.0])
    holm = [arm(result, key).versus.p_holm for key in ("all", "half", "none")]
    assert holm == pytest.approx([3 * 2 / 256, 2 * 2 / 16, 1.0])


# --- repeats -----------------------------------------------------------------------------------

REPEATS = {
    "a": {"base": "PPF", "new": "PPP"},
    "b": {"base": "FFF", "new": "FPF"},
    "c": {"base": "PPP", "new": "PPP"},
}


def test_it_gives_pass_at_k_and_pass_hat_k_with_repeats():
    base = arm(load.compare_runs([make_run(make_experiment(), REPEATS)]), "base")
    # Tasks: 2/3, 0/3, 3/3. pass@2 of 2/3 = 1 - C(1,2)/C(3,2) = 1; pass^2 = C(2,2)/C(3,2) = 1/3.
    assert base.pass_at_k == pytest.approx({1: 5 / 9, 2: 2 / 3, 3: 2 / 3})
    assert base.pass_hat_k == pytest.approx({1: 5 / 9, 2: 4 / 9, 3: 1 / 3})
    assert base.pass_at_k_units == {1: 3, 2: 3, 3: 3}
    assert all(base.pass_at_k_low[k] <= base.pass_at_k[k] <= base.pass_at_k_high[k] for k in (1, 2, 3))
    assert base.interval == "cluster-robust t over 3 clusters"
    assert base.flaky == ["a"]


def test_pass_at_k_is_over_one_set_of_units_for_every_k():
    outcomes = {"a": {"base": "PPF"}, "b": {"base": "PEF"}, "c": {"base": "FFP"}}
    base = arm(load.compare_runs([make_run(make_experiment(), outcomes)]), "base")
    # b lost a trial to an error: the curve is over a and c (3 graded trials, the usual count)
    # at every k, so it cannot bend because a different set of units enters at some k.
    assert base.pass_at_k == pytest.approx({1: 1 / 2, 2: (1 + 2 / 3) / 2, 3: 1.0})
    assert base.pass_hat_k == pytest.approx({1: 1 / 2, 2: 1 / 6, 3: 0.0})
    assert base.pass_at_k_units == {1: 2, 2: 2, 3: 2}
    # Floored: never a zero-width interval, inside [0, 1].
    assert all(0 <= base.pass_at_k_low[k] < base.pass_at_k[k] <= base.pass_at_k_high[k] <= 1 for k in (1, 2))


def test_it_tests_the_paired_difference_over_units_with_repeats():
    versus = arm(load.compare_runs([make_run(make_experiment(), REPEATS)]), "new").versus
    assert versus.test == "sign-flip (exact), floored by the number of clusters"
    # Per-unit differences 1/3, 1/3, 0: Δ is their mean; two equal non-zero differences flip
    # to the same |sum| in 2 of 4 sign patterns (p 1/2), but three clusters could miss an effect
    # of 2/9 with chance 2(1 - 2/9)^3: that is the p.
    assert versus.delta == pytest.approx(2 / 9)
    assert versus.low <= versus.delta <= versus.high
    assert versus.p_value == pytest.approx(max(0.5, 2 * (7 / 9) ** 3))
    # Three clusters cannot reach p < 0.05 (2/2^3 = 1/4): nothing is detectable.
    assert versus.mde is None
    assert [d.unit for d in versus.improved] == ["a", "b"] and versus.regressed == []


def test_it_never_gives_a_zero_width_interval_when_every_unit_agrees():
    outcomes = {slug: {"base": "PPF", "new": "PPF"} for slug in ("a", "b", "c")}
    result = load.compare_runs([make_run(make_experiment(), outcomes)])
    base, new = arm(result, "base"), arm(result, "new")
    assert base.pass_rate == pytest.approx(2 / 3) and base.low < 2 / 3 < base.high
    assert new.versus.delta == 0.0 and new.versus.low < 0 < new.versus.high
    assert new.versus.p_value == 1.0


# --- selection, warnings, heat-map ------------------------------------------------------------


def test_it_leaves_pending_and_cancelled_trials_out_of_the_rate():
    outcomes = {"a": {"base": "PFQ", "new": "PRC"}}
    result = load.compare_runs([make_run(make_experiment(), outcomes, status=Run.Status.RUNNING)])
    base, new = arm(result, "base"), arm(result, "new")
    assert (base.trials, base.pending, base.pass_rate) == (3, 1, 0.5)
    assert (new.pending, new.cancelled, new.pass_rate) == (1, 1, 1.0)
    assert any("is running" in note for note in result.warnings)


def test_it_filters_tasks_by_tag():
    outcomes = {
        "a": {"base": "P", "new": "F"},
        "b": {"base": "F", "new": "F"},
        "c": {"base": "P", "new": "P"},
    }
    run = make_run(make_experiment(), outcomes, tags={"a": ("x",), "b": ("y",), "c": ("x", "y")})
    data = load.load([run])
    assert data.tags == ["x", "y"]
    result = compare.compare(data, tags=["x"])
    assert [row.task.slug for row in result.rows] == ["a", "c"]
    assert arm(result, "base").passed == 2 and arm(result, "new").passed == 1


def test_it_takes_the_runs_baseline_and_refuses_an_unknown_one():
    run = make_run(make_experiment(), {"a": {"base": "P", "new": "F"}}, baseline="new")
    data = load.load([run])
    assert compare.compare(data).baseline == "new"
    assert compare.compare(data, baseline="base").baseline_arm.key == "base"
    with pytest.raises(ValueError, match="unknown baseline 'nope'"):
        compare.compare(data, baseline="nope")


def test_it_builds_a_task_by_variant_heat_map():
    run = make_run(make_experiment(), {"b": {"base": "PFE"}, "a": {"base": "P", "new": "F"}})
    result = load.compare_runs([run])
    assert [row.task.slug for row in result.rows] == ["a", "b"]
    first, second = result.rows
    assert [(c.passed, c.n) for c in first.cells] == [(1, 1), (0, 1)]
    assert (second.cells[0].passed, second.cells[0].n, second.cells[0].errors) == (1, 2, 1)
    assert second.cells[1] is None
    only = Trial.objects.get(run=run, task_version__task__slug="a", variant__slug="base")
    assert first.cells[0].first_trial_id == only.pk


def test_it_flags_a_variant_whose_trials_ran_different_configurations():
    run = make_run(
        make_experiment(), {"a": {"base": "PP", "new": "PP"}}, config_fingerprint={("a", "new", 1): "other"}
    )
    result = load.compare_runs([run])
    assert arm(result, "new").not_comparable == ["a"] and arm(result, "base").not_comparable == []
    assert any(note.startswith("Not comparable: in new") for note in result.warnings)


def test_it_compares_runs_and_warns_when_a_task_or_its_config_changed():
    experiment = make_experiment()
    outcomes = {slug: {"base": "P", "new": "F"} for slug in ("same", "edited", "regraded")}
    old = make_run(experiment, outcomes, baseline="base")
    new = make_run(
        experiment,
        outcomes,
        content={"edited": "v2"},
        config_fingerprint={("regraded", "base", 0): "new-grader"},
    )
    result = load.compare_runs([old, new])
    assert [a.key for a in result.arms] == [
        f"base@{old.pk}",
        f"new@{old.pk}",
        f"base@{new.pk}",
        f"new@{new.pk}",
    ]
    assert result.baseline == f"base@{old.pk}"
    task_note, config_note = [
        note for note in result.warnings if note.startswith(("Task changed", "Configuration or grader"))
    ]
    assert task_note.startswith(f"Task changed between run #{old.pk} and run #{new.pk}: edited ")
    assert config_note.startswith(
        f"Configuration or grader changed between run #{old.pk} and run #{new.pk} for regraded "
    )
    # The changed task still pairs across runs, but no test compares across the change.
    versus = arm(result, f"base@{new.pk}").versus
    assert versus.units == 3 and versus.p_value is None
    assert versus.untested.startswith(f"tasks changed between run #{old.pk} and run #{new.pk} (edited)")


def _ran_with(agent: str, image: str) -> dict:
    from runs_app.engine import identity

    environment = {"sandbox": "bubblewrap 0.8.0", "image": image}
    return {"agent": identity.component(agent), "environment": identity.component(environment)}


def test_a_comparison_of_two_runs_names_the_components_that_changed():
    experiment = make_experiment()
    outcomes = {"a": {"base": "PP", "new": "PF"}}
    before = {
        (t, v, r): _ran_with("claude-code 2.1.190", "sha256:aaa")
        for t in "a"
        for v in ("base", "new")
        for r in (0, 1)
    }
    after = {**before, **{("a", "new", r): _ran_with("claude-code 2.1.197", "sha256:bbb") for r in (0, 1)}}
    old = make_run(experiment, outcomes, baseline="base", components=before)
    new = make_run(experiment, outcomes, components=after)

    result = load.compare_runs([old, new])

    changed = [note for note in result.warnings if note.startswith("What ran")]
    assert changed == [
        f"What ran new changed between run #{old.pk} and run #{new.pk}: agent: claude-code 2.1.190 -> "
        "claude-code 2.1.197; environment.image: sha256:aaa -> sha256:bbb."
    ]
    # The run keeps its summary as trials are stored, and a whole recount rebuilds the same one.
    summary = Run.objects.get(pk=new.pk).components
    rollup.recount(new)
    assert Run.objects.get(pk=new.pk).components == summary
    assert set(summary[str(Variant.objects.get(slug="new").pk)]["agent"].values()) == {"claude-code 2.1.197"}


def test_it_loads_a_comparison_in_four_queries(django_assert_num_queries):
    experiment = make_experiment(variants=("base", "new", "third"))
    outcomes = {f"t{i}": {"base": "PF", "new": "PP", "third": "FE"} for i in range(5)}
    run = make_run(experiment, outcomes)
    run = Run.objects.select_related("experiment").get(pk=run.pk)
    with django_assert_num_queries(4):  # tallies, task versions, quarantines, variants
        data = load.load([run])
    with django_assert_num_queries(0):
        compare.compare(data)


def test_it_lists_the_current_trials_as_flat_rows():
    run = make_run(make_experiment(), {"a": {"base": "PF"}, "b": {"base": "E"}}, tags={"b": ("x",)})
    rows = list(exports.trial_rows(Trial.objects.for_run(run).current().order_by("pk")))
    assert [(r["task"], r["variant"], r["replicate"], r["status"]) for r in rows] == [
        ("a", "base", 0, "passed"),
        ("a", "base", 1, "failed"),
        ("b", "base", 0, "error"),
    ]
    assert list(rows[0]) == exports.TRIAL_COLUMNS
    assert rows[1]["label"] == "a#1"
    assert rows[1]["url"] == reverse("trial_detail", args=[run.pk, rows[1]["id"]])


def test_it_counts_two_versions_of_a_task_in_one_run_as_one_task():
    run = make_run(make_experiment(), {"a": {"base": "P"}})
    Trial.objects.create(
        run=run,
        task_version=task_version("a", content="v2"),
        variant=Variant.objects.get(slug="base"),
        status=Trial.Status.FAILED,
        config_fingerprint="other",
    )
    rollup.recount(run)
    result = load.compare_runs([run])
    (row,) = result.rows
    assert (row.cells[0].passed, row.cells[0].n, row.cells[0].total) == (1, 2, 2)
    assert arm(result, "base").not_comparable == ["a"]


def test_it_leaves_replaced_attempts_out():
    run = make_run(make_experiment(), {"a": {"base": "FP"}})
    Trial.objects.filter(run=run, replicate=0).update(is_latest=False)
    rollup.recount(run)
    base = arm(load.compare_runs([run]), "base")
    assert (base.trials, base.passed, base.failed) == (1, 1, 0)


def test_it_summarises_as_flat_rows_and_json_ready_data():
    result = load.compare_runs([make_run(make_experiment(), REPEATS)])
    rows = records.csv_rows(result)
    assert [row["arm"] for row in rows] == ["base", "new"]
    assert rows[1]["delta"] == pytest.approx(2 / 9) and rows[0]["delta"] is None
    assert rows[0]["pass_at_k_3"] == pytest.approx(2 / 3)
    data = records.comparison_record(result)
    assert data["arms"][1]["test"] == "sign-flip (exact), floored by the number of clusters"
    assert list(data["arms"][1]) == list(data["arms"][0]) and "pass_at_k" in data["arms"][0]
    assert data["cluster"] == "unit" and "cluster-robust t" in data["method"]


# --- charts ------------------------------------------------------------------------------------


def test_it_draws_valid_plotly_figures():
    result = load.compare_runs([make_run(make_experiment(), REPEATS)])
    figures = charts.figures(result)
    assert set(figures) == {"chart-pass-rate", "chart-forest", "chart-cost"}
    for figure in figures.values():
        go.Figure(figure)  # raises on any invalid property
    bars = figures["chart-pass-rate"]["data"][0]
    assert bars["y"] == pytest.approx([5 / 9, 7 / 9])
    base = arm(result, "base")
    assert bars["error_y"]["arrayminus"][0] == pytest.approx(base.pass_rate - base.low)
    forest = figures["chart-forest"]["data"][0]
    assert forest["y"] == ["new"] and forest["x"] == pytest.approx([2 / 9])
    frontier, cost = figures["chart-cost"]["data"]
    assert cost["x"] == pytest.approx([0.5, 0.5])
    # Same cost, new passes more often: base is beaten on both, hollow, off the frontier.
    assert frontier["y"] == pytest.approx([7 / 9]) and cost["marker"]["symbol"] == ["circle-open", "circle"]


def test_the_pareto_front_keeps_the_arms_no_other_beats_on_both():
    def summary(key, rate, cost):
        return charts.ArmSummary(**{**_blank_arm(key), "pass_rate": rate, "cost": cost, "trials": 10})

    arms = [summary("cheap", 0.4, 1.0), summary("dear", 0.8, 5.0), summary("worse", 0.5, 6.0),
            summary("tied", 0.4, 1.0), summary("middle", 0.6, 3.0)]  # fmt: skip
    assert [arm.key for arm in charts.pareto_front(arms)] == ["cheap", "tied", "middle", "dear"]


def _blank_arm(key: str) -> dict:
    fields = dict.fromkeys(charts.ArmSummary.__dataclass_fields__)
    counts = ("trials", "passed", "failed", "errors", "agent_errors", "cancelled", "tampered", "pending")
    fields.update(dict.fromkeys(counts, 0), key=key, label=key, run_id=1, variant_slug=key)
    fields.update(is_baseline=False, interval="", flaky=[], not_comparable=[], tokens=0)
    fields.update(answerer_cost=0.0, judge_cost=0.0, units=1, clusters=1)
    fields.update(pass_at_k={}, pass_at_k_low={}, pass_at_k_high={}, pass_at_k_units={}, pass_hat_k={})
    fields.update(versus=None, cs_low=0.0, cs_high=1.0, cs_units=0)
    return fields


def test_cost_deltas_are_paired_ratios_over_the_same_units():
    costs = {
        ("a", "base", 0): 1.0, ("a", "base", 1): 1.0, ("a", "new", 0): 2.0, ("a", "new", 1): 2.0,
        ("b", "base", 0): 3.0, ("b", "base", 1): 1.0, ("b", "new", 0): 2.0, ("b", "new", 1): 6.0,
        ("c", "base", 0): 1.0, ("c", "base", 1): 1.0, ("c", "new", 0): 1.0, ("c", "new", 1): 3.0,
        ("d", "new", 0): 9.0,
    }  # fmt: skip
    outcomes = {"a": {"base": "PF", "new": "PP"}, "b": {"base": "PP", "new": "FP"},
                "c": {"base": "FF", "new": "PE"}, "d": {"new": "P"}}  # fmt: skip
    result = load.compare_runs([make_run(make_experiment(), outcomes, baseline="base", cost_usd=costs)])
    versus = arm(result, "new").versus
    # Over a, b, c (d has no baseline): per trial 16/6 - 8/6; per pass 16/4 - 8/3.
    assert versus.cost_delta == pytest.approx(16 / 6 - 8 / 6)
    assert versus.cost_per_pass_delta == pytest.approx(16 / 4 - 8 / 3)
    assert versus.cost_delta_low < versus.cost_delta < versus.cost_delta_high
    new = arm(result, "new")
    assert new.mean_cost == pytest.approx(25 / 7) and new.mean_cost_low < new.mean_cost < new.mean_cost_high


def test_cross_run_and_long_labels_wrap_and_many_arms_lean_so_none_overlap():
    experiment = make_experiment(variants=("base", "a-rather-long-variant-name_v2"))
    outcomes = {"a": {"base": "P", "a-rather-long-variant-name_v2": "F"}}
    runs = [make_run(experiment, outcomes), make_run(experiment, outcomes)]
    figure = charts.pass_rate_figure(load.compare_runs(runs))
    labels = figure["data"][0]["x"]
    assert labels[0] == f"base<br>run #{runs[0].pk}"
    assert labels[1] == f"a-rather-long-<br>variant-name_v2<br>run #{runs[0].pk}"
    assert all(len(line) <= charts.LABEL_LINE for label in labels for line in label.split("<br>"))
    assert figure["layout"]["xaxis"] == {"automargin": True, "tickangle": 0}
    many = make_experiment(slug="many", variants=tuple(f"v{i}" for i in range(8)))
    result = load.compare_runs([make_run(many, {"a": {f"v{i}": "P" for i in range(8)}})])
    assert charts.pass_rate_figure(result)["layout"]["xaxis"]["tickangle"] == -40
    assert charts.cost_figure(result)["data"][1]["mode"] == "markers"
    for figure in charts.figures(result).values():
        go.Figure(figure)


def test_it_escapes_labels_in_charts():
    experiment = make_experiment(variants=("base", "<b>x</b>"))
    result = load.compare_runs([make_run(experiment, {"a": {"base": "P", "<b>x</b>": "F"}})])
    figure = charts.pass_rate_figure(result)
    assert figure["data"][0]["x"] == ["base", "&lt;b&gt;x&lt;/b&gt;"]
    assert not math.isnan(figure["data"][0]["y"][0])


# --- units, clusters, errors, breakdowns ---------------------------------------------------------


def test_dataset_rows_are_units_and_clusters_may_group_them_by_task_or_tag():
    rows = {("ds", v, i): f"r{i}" for v in ("base", "new") for i in range(4)}
    outcomes = {"ds": {"base": "PPFF", "new": "PPPF"}, "solo": {"base": "P", "new": "F"}}
    run = make_run(
        make_experiment(), outcomes, dataset_row_id=rows, tags={"ds": ("data",), "solo": ("data",)}
    )
    data = load.load([run])
    assert [unit.label for unit in data.units] == ["ds/r0", "ds/r1", "ds/r2", "ds/r3", "solo"]
    by_unit = compare.compare(data)
    by_task = compare.compare(data, cluster="task")
    by_tag = compare.compare(data, cluster="tag")
    assert [arm(r, "base").clusters for r in (by_unit, by_task, by_tag)] == [5, 2, 1]
    assert arm(by_unit, "base").pass_rate == arm(by_task, "base").pass_rate == pytest.approx(3 / 5)
    assert by_task.method.startswith("95% cluster-robust t interval (units clustered by task")
    with pytest.raises(ValueError, match="unknown clustering"):
        compare.compare(data, cluster="row")


def test_agent_errors_are_fails_and_infrastructure_errors_are_apart():
    run = make_run(
        make_experiment(),
        {"a": {"base": "PE"}, "b": {"base": "PE"}},
        error_category={("a", "base", 1): "max_turns", ("b", "base", 1): "rate_limit"},
    )
    base = arm(load.compare_runs([run]), "base")
    assert (base.errors, base.agent_errors, base.infra_errors) == (2, 1, 1)
    assert base.pass_rate == pytest.approx((1 / 2 + 1) / 2)  # a: 1 of 2 graded; b: 1 of 1
    assert base.rate_if_errors_fail == pytest.approx(1 / 2)


def test_arms_without_a_shared_unit_have_no_versus_anywhere():
    run = make_run(make_experiment(), {"a": {"base": "P"}, "b": {"new": "F"}})
    result = load.compare_runs([run])
    assert arm(result, "new").versus is None
    row = records.csv_rows(result)[1]
    assert row["delta"] is None and row["p_value"] is None and row["paired_units"] is None
    assert records.comparison_record(result)["arms"][1]["delta"] is None


def test_a_running_run_shows_no_p_values():
    outcomes = {f"t{i}": {"base": "F", "new": "PQ"} for i in range(12)}
    result = load.compare_runs([make_run(make_experiment(), outcomes, status=Run.Status.RUNNING)])
    versus = arm(result, "new").versus
    assert versus.delta == 1.0 and versus.p_value is None and versus.p_holm is None
    assert versus.untested.startswith("p-values are shown once the run has ended")


def test_a_variant_whose_configuration_changed_between_runs_is_not_tested():
    experiment = make_experiment()
    outcomes = {f"t{i}": {"base": "P", "new": "F"} for i in range(12)}
    old = make_run(experiment, outcomes, baseline="base")
    new = make_run(experiment, outcomes, fingerprint="other")
    result = compare.compare(load.load([old, new]), baseline=f"base@{old.pk}")
    versus = arm(result, f"base@{new.pk}").versus
    assert versus.p_value is None and versus.delta == 0.0
    assert versus.untested.startswith(f"base ran with another configuration in run #{new.pk}")
    assert arm(result, f"new@{old.pk}").versus.p_value is not None  # same run: tested


def test_it_breaks_rates_down_by_tag_and_by_criterion():
    run = make_run(
        make_experiment(), {"a": {"base": "PF"}, "b": {"base": "FF"}}, tags={"a": ("x",), "b": ("y",)}
    )
    for trial in Trial.objects.filter(run=run):
        for index, passed in enumerate((trial.status == Trial.Status.PASSED, True)):
            CriterionResult.objects.create(
                trial=trial, index=index, type="check", score=1.0 * passed, passed=passed
            )
    rollup.recount(run)
    result = load.compare_runs([run])
    assert [(row.name, row.cells[0].estimate) for row in result.by_tag] == [("x", 0.5), ("y", 0.0)]
    assert [(row.name, row.cells[0].estimate) for row in result.by_criterion] == [
        ("#1 check", pytest.approx(0.25)),
        ("#2 check", 1.0),
    ]
