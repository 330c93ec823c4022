"""The comparison's types: the loaded data (arms, units, cells) and what a comparison returns
(each arm's summary, its versus the baseline, breakdowns). Pure Python, no Django. `compare`
computes them, `notes` words them, `records` gives them their one shape outside the program.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from experiments_app.specs.gates import NON_INFERIORITY_MARGIN
from runs_app.analysis.stats.inference import Interval, PassCount
from runs_app.analysis.stats.tally import Tally

CONFIDENCE = 0.95
ALPHA = 0.05
POWER = 0.8
CLUSTERINGS = {
    "unit": "each (task, dataset row) its own cluster",
    "task": "units clustered by task",
    "tag": "units clustered by their task's first tag",
}


class Run(Protocol):
    """What a comparison reads of a run (`runs_app.models.Run` has it)."""

    pk: int
    status: str
    fingerprint: str
    gate_results: list

    @property
    def is_final(self) -> bool: ...


# Cell fields that add up when two cells merge.
SUMMED: tuple[str, ...] = (
    "passed", "failed", "errors", "agent_errors", "cancelled", "total", "score_sum", "score_n",
    "duration_sum", "duration_n", "tokens", "cost", "dataset_rows", "answerer_cost", "judge_cost",
    "tampered",
)  # fmt: skip


@dataclass
class Cell:
    """The current trials of one unit (or, merged, one task) in one arm."""

    passed: int = 0
    failed: int = 0
    errors: int = 0
    agent_errors: int = 0
    cancelled: int = 0
    total: int = 0
    score_sum: float = 0.0
    score_n: int = 0
    duration_sum: float = 0.0
    duration_n: int = 0
    tokens: int = 0
    cost: float = 0.0
    first_trial_id: int | None = None
    # Smallest and largest config fingerprint: equal when every trial ran the same config.
    fingerprints: tuple[str, str] = ("", "")
    dataset_rows: int = 0
    # What the simulated user's and the judge's model calls cost (`cost` is the agent's).
    answerer_cost: float = 0.0
    judge_cost: float = 0.0
    # Trials that changed the task's protected paths (failed, flagged).
    tampered: int = 0

    @property
    def tally(self) -> Tally:
        return Tally(self.passed, self.failed, self.errors, self.agent_errors)

    @property
    def n(self) -> int:
        """Graded trials (agent errors included): the denominator of the pass rate."""
        return self.tally.graded

    @property
    def rate(self) -> float | None:
        return self.tally.rate

    @property
    def pending(self) -> int:
        return self.total - self.passed - self.failed - self.errors - self.cancelled

    @property
    def mean_duration(self) -> float | None:
        return self.duration_sum / self.duration_n if self.duration_n else None

    def merged(self, other: Cell) -> Cell:
        return Cell(
            **{name: getattr(self, name) + getattr(other, name) for name in SUMMED},
            first_trial_id=min((i for i in (self.first_trial_id, other.first_trial_id) if i), default=None),
            fingerprints=(
                min(self.fingerprints[0], other.fingerprints[0]),
                max(self.fingerprints[1], other.fingerprints[1]),
            ),
        )


@dataclass(frozen=True)
class Arm:
    """One variant of one run."""

    key: str  # the URL value: the variant slug, or "slug@run" across several runs
    label: str
    run_id: int
    variant_id: int
    variant_slug: str


@dataclass(frozen=True)
class TaskInfo:
    task_id: int
    slug: str
    tags: tuple[str, ...]


@dataclass(frozen=True)
class Unit:
    """One (task, dataset row): the analysis unit."""

    task: TaskInfo
    row: str = ""  # the dataset row id; "" for a plain task

    @property
    def key(self) -> tuple[int, str]:
        return (self.task.task_id, self.row)

    @property
    def label(self) -> str:
        return f"{self.task.slug}/{self.row}" if self.row else self.task.slug


@dataclass
class ComparisonData:
    """What `load` read from the database; `compare` needs nothing else."""

    runs: list[Run]
    arms: list[Arm]
    tasks: list[TaskInfo]  # sorted by slug
    units: list[Unit]  # sorted by task slug, then row
    cells: dict[tuple[str, int, str], Cell]  # (arm key, task id, row)
    digests: dict[tuple[int, int], str]  # (run id, task id) -> task bundle digest
    default_baseline: str | None
    # (arm key, criterion label) -> {(task id, row): (passes, n)}
    criteria: dict[tuple[str, str], dict[tuple[int, str], PassCount]] = field(default_factory=dict)
    # (run id, variant id) -> {component: {fingerprint: value}}: what its trials ran with (`identity`)
    components: dict[tuple[int, int], dict[str, dict[str, Any]]] = field(default_factory=dict)
    # Tasks of these runs set aside as broken, left out of everything above: {"task", "reason",
    # "by", "since"} each, for every page to say so.
    quarantined: list[dict[str, str]] = field(default_factory=list)
    # The baseline the run was launched with, when it has no trial here (`default_baseline` is
    # then another arm, which the comparison must not silently compare against).
    missing_baseline: str = ""

    @property
    def tags(self) -> list[str]:
        return sorted({tag for task in self.tasks for tag in task.tags})


@dataclass
class UnitDelta:
    unit: str
    baseline: str  # "k/n"
    variant: str
    delta: float
    p_value: float  # Fisher's exact test of this unit alone (informative: a few repeats prove little)


@dataclass
class Versus:
    """An arm against the baseline, over the units both graded.

    `baseline_rate` and `arm_rate` are both arms' rates over exactly those units, so
    Δ = arm_rate - baseline_rate. `p_value` is None while a run is still going and where no
    test is valid (`untested` says why)."""

    units: int
    clusters: int
    baseline_rate: float
    arm_rate: float
    delta: float
    low: float
    high: float
    se: float | None
    mde: float | None  # the |Δ| this design detects with 80% power at α
    test: str | None
    p_value: float | None = None
    p_holm: float | None = None
    untested: str = ""
    delta_if_errors_fail: float | None = None
    delta_if_errors_fail_low: float | None = None
    delta_if_errors_fail_high: float | None = None
    # The same with every infrastructure error counted as a pass: with the above, how much Δ
    # could depend on the trials the errors took.
    delta_if_errors_pass: float | None = None
    delta_if_errors_pass_low: float | None = None
    delta_if_errors_pass_high: float | None = None
    # Significant (Holm p < α) but not with every error a fail, or not with every error a pass.
    depends_on_errors: bool = False
    # Anytime-valid (`inference.confidence_sequence`) over the units both arms have finished, in
    # the order they finished: valid while the run goes on, so a run may be stopped once it is
    # `decided` ("better", "worse", "not worse" than the baseline by the margin: `compare.decision`).
    cs_low: float = -1.0
    cs_high: float = 1.0
    cs_units: int = 0  # the finished paired units it is over
    decided: str = ""
    margin: float = NON_INFERIORITY_MARGIN  # of "not worse"
    baseline_error_share: float | None = None  # infrastructure errors / finished, unit-weighted
    arm_error_share: float | None = None
    error_p: float | None = None  # sign-flip p of equal infrastructure error shares
    errors_differ: bool = False  # error_p below the comparison's α
    # The arm's cost per ended trial, and per passed trial, minus the baseline's, in USD over the
    # units both ended trials of (the agent's calls), with paired intervals.
    cost_delta: float | None = None
    cost_delta_low: float | None = None
    cost_delta_high: float | None = None
    cost_per_pass_delta: float | None = None
    cost_per_pass_delta_low: float | None = None
    cost_per_pass_delta_high: float | None = None
    improved: list[UnitDelta] = field(default_factory=list)
    regressed: list[UnitDelta] = field(default_factory=list)
    # How many units would show a change in each direction if the arms were the same (each unit
    # at its pooled rate): the lists are read against these.
    improved_by_chance: float = 0.0
    regressed_by_chance: float = 0.0

    @property
    def significant(self) -> bool:
        """Holm p below the comparison's α, whatever the infrastructure errors took."""
        return self.p_holm is not None and self.p_holm < self.alpha and not self.depends_on_errors

    alpha: float = 0.05


@dataclass
class ArmSummary:
    key: str
    label: str
    run_id: int
    variant_slug: str
    is_baseline: bool
    trials: int
    passed: int
    failed: int
    errors: int
    agent_errors: int
    cancelled: int
    tampered: int
    pending: int
    units: int  # units with at least one graded trial
    clusters: int
    pass_rate: float | None
    low: float | None
    high: float | None
    interval: str  # how the interval was computed, in words
    rate_if_errors_fail: float | None
    rate_if_errors_fail_low: float | None
    rate_if_errors_fail_high: float | None
    mean_score: float | None
    mean_score_low: float | None
    mean_score_high: float | None
    # The median over units of each unit's mean graded-trial duration.
    median_duration: float | None
    pass_at_k: dict[int, float]
    pass_at_k_low: dict[int, float]
    pass_at_k_high: dict[int, float]
    pass_at_k_units: dict[int, int]  # units with at least k graded trials
    pass_hat_k: dict[int, float]
    tokens: int
    cost: float  # the agent's calls only; the answerer's and the judge's are apart
    answerer_cost: float
    judge_cost: float
    mean_cost_low: float | None  # the interval of `mean_cost`, cost per ended trial
    mean_cost_high: float | None
    cost_per_pass: float | None
    cost_per_pass_low: float | None
    cost_per_pass_high: float | None
    flaky: list[str]
    not_comparable: list[str]
    versus: Versus | None = None
    # The rate's anytime-valid interval over the units the arm has finished, in finishing order
    # (`inference.confidence_sequence`): what a live run may be watched by.
    cs_low: float = 0.0
    cs_high: float = 1.0
    cs_units: int = 0

    @property
    def infra_errors(self) -> int:
        return self.errors - self.agent_errors

    @property
    def mean_cost(self) -> float | None:
        """Cost per ended trial, whatever its outcome (errors and cancellations cost too)."""
        finished = self.trials - self.pending
        return self.cost / finished if finished else None


@dataclass
class HeatRow:
    task: TaskInfo
    cells: list[Cell | None]  # one per arm, in the arms' order; a task's rows merged


@dataclass
class BreakdownRow:
    """One tag or criterion: each arm's rate and interval over the units it covers."""

    name: str
    cells: list[Interval | None]


@dataclass
class Comparison:
    runs: list[Run]
    arms: list[ArmSummary]
    baseline: str
    tags: list[str]
    cluster: str
    repeats: int  # most graded trials of one unit in one arm
    confidence: float
    alpha: float
    seed: int
    final: bool  # every run has ended: p-values are shown
    rows: list[HeatRow]
    units: int
    by_tag: list[BreakdownRow]
    by_criterion: list[BreakdownRow]
    warnings: list[str]
    overall: Interval | None = None  # every arm's trials of a unit together
    quarantined: list[dict[str, str]] = field(default_factory=list)  # tasks left out (ComparisonData's)
    # Why no arm is compared with the baseline ("" when they are): it has no trial, or none
    # graded. Said on every page and output instead of numbers against another arm.
    baseline_problem: str = ""

    @property
    def baseline_arm(self) -> ArmSummary | None:
        return next((arm for arm in self.arms if arm.key == self.baseline and arm.is_baseline), None)

    @property
    def baseline_label(self) -> str:
        arm = self.baseline_arm
        return arm.label if arm else self.baseline

    @property
    def others(self) -> list[ArmSummary]:
        return [arm for arm in self.arms if not arm.is_baseline]

    @property
    def max_k(self) -> int:
        return max((max(arm.pass_at_k, default=0) for arm in self.arms), default=0)

    @property
    def method(self) -> str:
        """The interval and test, in words (beside every interval shown)."""
        return method_text(self.cluster, self.confidence)

    def arm(self, key: str) -> ArmSummary | None:
        return next((arm for arm in self.arms if arm.key == key), None)


def method_text(cluster: str, confidence: float) -> str:
    return (
        f"{round(confidence * 100)}% cluster-robust t interval ({CLUSTERINGS.get(cluster, cluster)}; "
        "floored by Wilson near 0% and 100%); Δ: the sign-flip permutation test inverted, floored by "
        "the number of clusters and guarded against skew by the bootstrap-t, Holm-adjusted"
    )
