"""Run gates: the checks an experiment declares (`gates:` in its YAML), judged when a run ends.

Pure (no Django). A gate spec is a dict validated by `experiments_app.specs.Gate`. Judging reads a
`RunFacts` (per-variant counts, rates and intervals, the comparison against the baseline, the
dataset suites: built by `analysis.load.run_facts` from the same comparison every page shows) and
returns one result per gate, `{"gate", "name", "passed", "detail"}`, whose detail says why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from experiments_app.specs import (
    Gate,
    MaxErrorShareGate,
    MinPassRateGate,
    NoRegressionGate,
    SuiteThresholdsGate,
)
from runs_app.analysis.stats.comparison import ArmSummary, Comparison
from runs_app.analysis.stats.tally import Tally

_GATE_LIST = TypeAdapter(list[Gate])
_GATE = TypeAdapter(Gate)


@dataclass(frozen=True)
class VersusFacts:
    """A variant against the baseline over the units both graded (`compare.Versus`)."""

    clusters: int
    baseline_rate: float
    arm_rate: float
    delta: float
    low: float
    high: float
    p_holm: float | None  # Holm-adjusted across the run's variants; None when untested
    untested: str = ""  # why no test was run
    low_if_errors_fail: float | None = None  # Δ's lower bound with every error a fail
    detectable: float | None = None  # the smallest |Δ| the design detects; None: none


@dataclass(frozen=True)
class VariantFacts:
    """One variant's counts, its rate and interval, and, unless it is the baseline, how it
    compares with it."""

    slug: str
    passed: int = 0
    failed: int = 0
    errors: int = 0
    agent_errors: int = 0
    rate: float | None = None
    low: float | None = None
    high: float | None = None
    low_if_errors_fail: float | None = None  # the rate's lower bound with every error a fail
    versus: VersusFacts | None = None

    @property
    def tally(self) -> Tally:
        return Tally(self.passed, self.failed, self.errors, self.agent_errors)


@dataclass(frozen=True)
class RunFacts:
    variants: list[VariantFacts]
    baseline: str | None = None
    suites: list[dict] = field(default_factory=list)  # Run.suite_results
    overall: VariantFacts | None = None  # every variant's units together
    method: str = ""  # how the intervals were computed, named in the details
    baseline_problem: str = ""  # why nothing is compared with the baseline (`Comparison`)
    # The same facts under another clustering, for gates that name one (`cluster: task`).
    clustered: dict[str, RunFacts] = field(default_factory=dict)

    def under(self, cluster: str) -> RunFacts:
        return self.clustered.get(cluster, self)


def facts_of(summary: Comparison, suites: list[dict]) -> RunFacts:
    """What the gates judge of a comparison (`analysis.load.run_facts` gives it a run's)."""
    facts = [_variant_facts(arm) for arm in summary.arms]
    overall = None
    if summary.overall is not None:
        overall = VariantFacts(
            "overall",
            passed=sum(arm.passed for arm in summary.arms),
            failed=sum(arm.failed for arm in summary.arms),
            errors=sum(arm.errors for arm in summary.arms),
            agent_errors=sum(arm.agent_errors for arm in summary.arms),
            rate=summary.overall.estimate,
            low=summary.overall.low,
            high=summary.overall.high,
        )
    return RunFacts(
        facts, summary.baseline or None, list(suites), overall, summary.method, summary.baseline_problem
    )


def _variant_facts(arm: ArmSummary) -> VariantFacts:
    versus = arm.versus
    return VariantFacts(
        arm.key,
        passed=arm.passed,
        failed=arm.failed,
        errors=arm.errors,
        agent_errors=arm.agent_errors,
        rate=arm.pass_rate,
        low=arm.low,
        high=arm.high,
        low_if_errors_fail=arm.rate_if_errors_fail_low,
        versus=VersusFacts(
            clusters=versus.clusters,
            baseline_rate=versus.baseline_rate,
            arm_rate=versus.arm_rate,
            delta=versus.delta,
            low=versus.low,
            high=versus.high,
            p_holm=versus.p_holm,
            untested=versus.untested,
            low_if_errors_fail=versus.delta_if_errors_fail_low,
            detectable=versus.mde,
        )
        if versus
        else None,
    )


def validate_gates(gates: list[Any]) -> list[dict]:
    """Gate specs as canonical dicts (defaults filled in); raises pydantic's ValidationError."""
    return [gate.model_dump(mode="json") for gate in _GATE_LIST.validate_python(gates)]


def evaluate_gates(gates: list[dict], facts: RunFacts) -> list[dict]:
    """Judge every gate against the run's facts, in the order declared."""
    return [_evaluate_one(raw, facts) for raw in gates]


def unjudged(gates: list[dict], why: str) -> list[dict]:
    """Every gate failed with the same reason (the facts could not be gathered)."""
    return [_result(gate, "gate evaluation", False, why) for gate in gates]


def clusterings(gates: list[dict]) -> set[str]:
    """The clusterings the gates name besides the default."""
    return {
        str(gate.get("cluster"))
        for gate in gates
        if isinstance(gate, dict) and gate.get("cluster", "unit") != "unit"
    }


def all_passed(results: list[dict]) -> bool | None:
    """True when every gate holds, None when the run declares none."""
    return all(result["passed"] for result in results) if results else None


def _evaluate_one(raw: Any, facts: RunFacts) -> dict:
    try:
        gate = _GATE.validate_python(raw)
    except ValidationError as exc:
        # A stored gate that no longer validates must fail loudly, never pass unchecked.
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        return _result(raw, "invalid gate", False, f"invalid gate spec: {problems}")
    judges: dict[type, Callable[..., tuple[str, bool, str]]] = {
        MinPassRateGate: _min_pass_rate,
        NoRegressionGate: _no_regression,
        MaxErrorShareGate: _max_error_share,
        SuiteThresholdsGate: _suite_thresholds,
    }
    judge = judges[type(gate)]
    cluster = getattr(gate, "cluster", "unit")
    if cluster != "unit" and cluster not in facts.clustered:
        return _result(gate.model_dump(mode="json"), gate.name or type(gate).__name__, False,
                       f"no facts clustered by {cluster} were gathered")  # fmt: skip
    default_name, passed, detail = judge(gate, facts.under(cluster))
    if cluster != "unit":
        default_name += f" [clustered by {cluster}]"
    return _result(gate.model_dump(mode="json"), gate.name or default_name, passed, detail)


def _result(gate: Any, name: str, passed: bool, detail: str) -> dict:
    return {"gate": gate, "name": name, "passed": passed, "detail": detail}


def _scope(gate: Any) -> str:
    if getattr(gate, "overall", False):
        return "overall"
    return gate.variant or "each variant"


def _targets(gate: Any, facts: RunFacts) -> list[VariantFacts] | str:
    """The variants a gate looks at, or a message saying why there are none."""
    if getattr(gate, "overall", False):
        return [facts.overall] if facts.overall else "the run has no graded trial"
    if gate.variant is None:
        return facts.variants or "the run has no variants"
    chosen = [v for v in facts.variants if v.slug == gate.variant]
    return chosen or f"variant {gate.variant!r} is not part of this run"


def _min_pass_rate(gate: MinPassRateGate, facts: RunFacts) -> tuple[str, bool, str]:
    bound = gate.use == "lower_bound"
    name = f"min_pass_rate >= {gate.value:.0%} ({_scope(gate)}{', lower bound' if bound else ''})"
    targets = _targets(gate, facts)
    if isinstance(targets, str):
        return name, False, targets
    passed, parts = True, []
    for variant in targets:
        if variant.rate is None or variant.low is None or variant.high is None:
            passed = False
            parts.append(f"{variant.slug}: no graded trial")
            continue
        judged = variant.low if bound else variant.rate
        ok = judged >= gate.value
        figure = f"{variant.slug}: {variant.rate:.1%} [{variant.low:.1%}, {variant.high:.1%}]"
        if (
            bound
            and ok
            and variant.low_if_errors_fail is not None
            and variant.low_if_errors_fail < gate.value
        ):
            ok = False
            parts.append(
                f"{figure}: cannot decide: its lower bound {variant.low:.1%} reaches {gate.value:.1%}, but "
                f"with every infrastructure error a fail it is {variant.low_if_errors_fail:.1%}: the "
                f"{variant.tally.infra_errors} errors could hide fails (run them again)"
            )
        elif bound and ok:
            parts.append(f"{figure}: its lower bound {variant.low:.1%} reaches {gate.value:.1%}")
        elif bound:
            parts.append(
                f"{figure}: its lower bound {variant.low:.1%} is below {gate.value:.1%}, so the run does not "
                "show the rate reaches it (more tasks narrow the interval; `use: estimate` judges the "
                "point estimate)"
            )
        else:
            parts.append(f"{figure}: the estimate is {'at least' if ok else 'below'} {gate.value:.1%}")
        passed &= ok
    return name, passed, "; ".join(parts) + _method(facts)


def _max_error_share(gate: MaxErrorShareGate, facts: RunFacts) -> tuple[str, bool, str]:
    name = f"max_error_share <= {gate.value:.0%} ({_scope(gate)})"
    targets = _targets(gate, facts)
    if isinstance(targets, str):
        return name, False, targets
    passed, parts = True, []
    for variant in targets:
        tally = variant.tally
        if tally.error_share is None:
            passed = False
            parts.append(f"{variant.slug}: no finished trial")
            continue
        ok = tally.error_share <= gate.value
        passed &= ok
        sign = "<=" if ok else ">"
        parts.append(
            f"{variant.slug}: {tally.errors}/{tally.finished} errors = {tally.error_share:.1%} {sign} "
            f"{gate.value:.1%}"
        )
    return name, passed, "; ".join(parts)


def _no_regression(gate: NoRegressionGate, facts: RunFacts) -> tuple[str, bool, str]:
    name = f"no_regression vs {facts.baseline or 'baseline'} (margin {gate.margin:.0%}, {_scope(gate)})"
    if gate.variant is not None and gate.variant == facts.baseline:
        return name, False, f"variant {gate.variant!r} is the baseline: name another variant"
    targets = _targets(gate, facts)
    if isinstance(targets, str):
        return name, False, targets
    if facts.baseline_problem:
        return name, False, facts.baseline_problem
    others = [v for v in targets if v.slug != facts.baseline]
    if not others:
        return name, False, "only the baseline ran: there is no variant to judge"
    passed, parts = True, []
    for variant in others:
        ok, words = _judge_regression(gate, variant)
        passed &= ok
        parts.append(f"{variant.slug}: {words}")
    return name, passed, "; ".join(parts) + _method(facts)


def _judge_regression(gate: NoRegressionGate, variant: VariantFacts) -> tuple[bool, str]:
    """Non-inferiority: Δ's lower bound at least -margin, as measured and with every error a fail."""
    versus = variant.versus
    if versus is None:
        return False, "no unit graded in both arms, so there is no evidence it did not regress"
    figure = (
        f"Δ {versus.delta * 100:+.1f} pp [{versus.low * 100:+.1f}, {versus.high * 100:+.1f}] "
        f"({versus.arm_rate:.1%} vs {versus.baseline_rate:.1%} over the same units)"
    )
    detectable = (
        f"the design detects |Δ| ≥ {versus.detectable * 100:.1f} pp"
        if versus.detectable is not None
        else f"{versus.clusters} paired clusters detect no Δ at all"
    )
    if versus.clusters < gate.min_clusters:
        return False, (
            f"{figure} over only {versus.clusters} paired clusters, fewer than the {gate.min_clusters} "
            f"this gate needs as evidence ({detectable})"
        )
    if versus.untested:
        return False, f"{figure}: no valid comparison ({versus.untested})"
    margin = -gate.margin
    if versus.low < margin:
        why = (
            f"cannot decide: {detectable}, more than the {gate.margin * 100:.1f} pp margin (add tasks)"
            if versus.detectable is None or versus.detectable > gate.margin
            else f"its lower bound is beyond the -{gate.margin * 100:.1f} pp margin"
        )
        return False, f"{figure}: {why}"
    if versus.low_if_errors_fail is not None and versus.low_if_errors_fail < margin:
        return False, (
            f"{figure}: cannot decide: with every infrastructure error a fail the lower bound is "
            f"{versus.low_if_errors_fail * 100:+.1f} pp, beyond the margin (run the errors again)"
        )
    return True, f"{figure}: the lower bound is within the -{gate.margin * 100:.1f} pp margin ({detectable})"


def _method(facts: RunFacts) -> str:
    return f" ({facts.method})" if facts.method else ""


def _suite_thresholds(gate: SuiteThresholdsGate, facts: RunFacts) -> tuple[str, bool, str]:
    name = f"suite_thresholds ({_scope(gate)})"
    suites = [s for s in facts.suites if gate.variant is None or s.get("variant") == gate.variant]
    if not suites:
        # Declared but nothing to check: most likely the dataset task was filtered out.
        return name, False, "no dataset task with suite_thresholds ran in this run"
    failing = [f"{s.get('task')} × {s.get('variant')}" for s in suites if not s.get("passed")]
    if failing:
        return name, False, f"{len(failing)} of {len(suites)} suites below threshold: {', '.join(failing)}"
    return name, True, f"all {len(suites)} suites met their thresholds"
