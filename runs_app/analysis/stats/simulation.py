"""Seeded simulated experiments: what the validity claims of `analysis.inference` rest on.

No Django. Tasks draw a difficulty p ~ Beta(a, b) (the baseline's chance to pass), the variant's is
expit(logit(p) + shift), and each arm runs `repeats` trials per task. `validity` replays one
design many times and returns the coverage of the rate and Δ intervals, and how often the
sign-flip test rejects at α (the false-positive rate when shift = 0, the power otherwise).
`comparison_data` builds the same experiment as a `ComparisonData`, so a replicate can go through
the real `compare()` (bench/stats_validity.py and the tests do both).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import expit, logit

from runs_app.analysis.stats import inference
from runs_app.analysis.stats.comparison import Arm, Cell, ComparisonData, TaskInfo, Unit


@dataclass(frozen=True)
class Design:
    clusters: int
    repeats: int
    a: float = 2.0  # task difficulty ~ Beta(a, b)
    b: float = 2.0
    shift: float = 0.0  # the variant's log-odds change on every task
    error_share: float = 0.0  # of the variant's failed trials that end as infrastructure errors
    # A sparse effect: the variant fixes this share of the failing tasks (p < 1/2 becomes 1 - p),
    # leaving every other task as it was; or breaks this share of the passing ones (p > 1/2
    # becomes 1 - p): a regression on a few tasks.
    fixes: float = 0.0
    breaks: float = 0.0


@dataclass(frozen=True)
class Validity:
    design: Design
    replicates: int
    rate_coverage: float
    delta_coverage: float
    rejected: float  # share of replicates with sign-flip p < alpha
    true_rate: float
    true_delta: float

    @property
    def monte_carlo_error(self) -> float:
        """One standard error of a share near 95% over these replicates."""
        return (0.95 * 0.05 / self.replicates) ** 0.5


def true_values(design: Design, seed: int = 12345) -> tuple[float, float]:
    """The population's baseline pass rate, and Δ = E[p_variant - p_baseline] (by 400,000 draws)."""
    rng = np.random.default_rng(seed)
    p = rng.beta(design.a, design.b, 400_000)
    fixed = rng.random(len(p)) < design.fixes
    broken = rng.random(len(p)) < design.breaks
    return design.a / (design.a + design.b), float((_variant(p, design.shift, fixed, broken) - p).mean())


def draw(design: Design, rng: np.random.Generator) -> tuple[list, list]:
    """One replicate: per task, (passes, graded) of the baseline and of the variant."""
    p = rng.beta(design.a, design.b, design.clusters)
    fixed = rng.random(design.clusters) < design.fixes
    broken = rng.random(design.clusters) < design.breaks
    base = rng.binomial(design.repeats, p)
    passes = rng.binomial(design.repeats, _variant(p, design.shift, fixed, broken))
    fails = design.repeats - passes
    errors = rng.binomial(fails, design.error_share) if design.error_share else np.zeros_like(fails)
    baseline = [(int(k), design.repeats) for k in base]
    variant = [(int(k), int(design.repeats - e)) for k, e in zip(passes, errors, strict=True)]
    return baseline, variant


def validity(design: Design, replicates: int, *, seed: int = 0, alpha: float = 0.05) -> Validity:
    rng = np.random.default_rng(seed)
    true_rate, true_delta = true_values(design)
    clusters = list(range(design.clusters))
    covered_rate = covered_delta = rejected = 0
    for _ in range(replicates):
        baseline, variant = draw(design, rng)
        rate = inference.rate_interval(baseline, clusters)
        covered_rate += rate is not None and rate.low <= true_rate <= rate.high
        delta = inference.difference_interval(baseline, variant, clusters, 1 - alpha)
        covered_delta += delta is not None and delta.low - 1e-12 <= true_delta <= delta.high + 1e-12
        rejected += delta is not None and delta.p_value < alpha
    return Validity(
        design,
        replicates,
        covered_rate / replicates,
        covered_delta / replicates,
        rejected / replicates,
        true_rate,
        true_delta,
    )


def comparison_data(design: Design, rng: np.random.Generator, *, rows: bool = False) -> ComparisonData:
    """One replicate as the comparison's input: two arms of one finished run. With `rows`, the
    units are the dataset rows of a single task instead of one task each."""
    baseline, variant = draw(design, rng)
    arms = [Arm("base", "base", 1, 1, "base"), Arm("new", "new", 1, 2, "new")]
    if rows:
        task = TaskInfo(1, "dataset", ())
        units = [Unit(task, f"row-{i:04d}") for i in range(design.clusters)]
    else:
        units = [Unit(TaskInfo(i + 1, f"task-{i:04d}", ()), "") for i in range(design.clusters)]
    cells = {}
    for unit, (bp, bn), (vp, vn) in zip(units, baseline, variant, strict=True):
        cells[("base", *unit.key)] = Cell(passed=bp, failed=bn - bp, total=bn, dataset_rows=bn * rows)
        errors = design.repeats - vn
        cells[("new", *unit.key)] = Cell(
            passed=vp, failed=vn - vp, errors=errors, total=design.repeats, dataset_rows=design.repeats * rows
        )
    return ComparisonData(
        runs=[_FinishedRun()],
        arms=arms,
        tasks=sorted({unit.task for unit in units}, key=lambda task: task.slug),
        units=units,
        cells=cells,
        digests={},
        default_baseline="base",
    )


def planned_data(
    units: int, repeats: int, compared: int, model, effect: float, rng: np.random.Generator
) -> ComparisonData:
    """One run as the planner imagines it (`planning.simulated_power`), as the comparison's
    input: a baseline, a variant with `effect` laid as the planner lays it, and `compared - 1`
    variants the same as the baseline; so its claims can be checked through the real compare()."""
    from runs_app.analysis.stats import planning

    base_p = planning.difficulties(model, (units,), rng)
    share, size = planning.laid_effect(effect, model)
    chances = [base_p, base_p + size * (1 - base_p) * (rng.random(units) < share)]
    chances += [base_p] * (compared - 1)
    keys = ["base", "new", *(f"same-{i}" for i in range(1, compared))]
    arms = [Arm(key, key, 1, i + 1, key) for i, key in enumerate(keys)]
    tasks = [TaskInfo(i + 1, f"task-{i:04d}", ()) for i in range(units)]
    cells = {}
    for key, chance in zip(keys, chances, strict=True):
        for task, passes in zip(tasks, rng.binomial(repeats, chance), strict=True):
            cells[(key, task.task_id, "")] = Cell(
                passed=int(passes), failed=repeats - int(passes), total=repeats
            )
    return ComparisonData(
        runs=[_FinishedRun()],
        arms=arms,
        tasks=tasks,
        units=[Unit(task, "") for task in tasks],
        cells=cells,
        digests={},
        default_baseline="base",
    )


def gate_passes(design: Design, gate: dict, replicates: int, *, seed: int = 0) -> float:
    """The share of simulated finished runs of `design` in which `gate` passes, judged as a run's
    gates are: through compare() and the gates (`gates.facts_of`, `gates.evaluate_gates`)."""
    from runs_app.analysis.stats import compare, gates

    specs = gates.validate_gates([gate])
    rng = np.random.default_rng(seed)
    passed = 0
    for _ in range(replicates):
        summary = compare.compare(comparison_data(design, rng), final=True)
        (result,) = gates.evaluate_gates(specs, gates.facts_of(summary, []))
        passed += result["passed"]
    return passed / replicates


def stopping_claims(
    design: Design, replicates: int, *, seed: int = 0, margin: float | None = None
) -> tuple[float, float]:
    """Optional stopping: a team watches a run's units finish one by one and stops on the first
    claim. Returns the share of runs with a claim (a) by the anytime-valid interval of Δ
    (`inference.confidence_sequence` and `compare.decision`, as compare() computes them for the
    run page), and (b) by a fixed-sample 95% t interval looked at after every unit from the
    tenth on (what a team must not do). The claim is "better" or "worse" (with no `margin`: the
    false positives when the arms are the same), or "not worse" or "better" by `margin` (with
    one: false when the variant is worse by at least that). The anytime-valid interval is the
    running intersection, so the one computed over all the units holds every claim a look could
    have made."""
    from runs_app.analysis.stats import compare

    rng = np.random.default_rng(seed)
    anytime = fixed = 0
    for _ in range(replicates):
        baseline, variant = draw(design, rng)
        values = np.array([pa / na - pb / nb for (pb, nb), (pa, na) in zip(baseline, variant, strict=True)])
        decided = compare.decision(*inference.confidence_sequence(list(values)), margin or 0.0)
        n = np.arange(1, len(values) + 1)
        mean = np.cumsum(values) / n
        variance = (np.cumsum(values**2) - n * mean**2) / np.maximum(n - 1, 1)
        half = 1.96 * np.sqrt(np.maximum(variance, 0) / n)
        looks = slice(9, None)
        if margin is None:
            anytime += decided in ("better", "worse")
            fixed += bool(np.any(np.abs(mean[looks]) > half[looks]))
        else:
            anytime += decided in ("better", "not worse")
            fixed += bool(np.any(mean[looks] - half[looks] > -margin))
    return anytime / replicates, fixed / replicates


class _FinishedRun:
    pk = 1
    status = "finished"
    fingerprint = "simulated"
    gate_results: list = []
    is_final = True


def _variant(
    p: np.ndarray, shift: float, fixed: np.ndarray | None = None, broken: np.ndarray | None = None
) -> np.ndarray:
    if shift:
        p = expit(logit(np.clip(p, 1e-12, 1 - 1e-12)) + shift)
    if fixed is not None and fixed.any():
        p = np.where(fixed & (p < 0.5), 1 - p, p)
    if broken is not None and broken.any():
        p = np.where(broken & (p > 0.5), 1 - p, p)
    return p
