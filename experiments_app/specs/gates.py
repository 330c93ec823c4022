"""Pydantic models of evalsite's gates: checks evaluated when a run ends (no Django).

An experiment lists them under `gates`; they decide evalrun's exit code.
`runs_app.analysis.stats.gates` judges them; `specs.ExperimentSpec` checks their variant names
with `gate_issues`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# The regression `no_regression` tolerates by default, and the margin a live run's anytime-valid
# interval is read against ("not worse"): 5 pp, the smallest regression a team acts on that
# suites of a few dozen tasks can show.
NON_INFERIORITY_MARGIN = 0.05


class GateModel(BaseModel):
    """Base of the gate specs. Unlike other specs, unknown keys are errors: a mistyped gate key
    (`valeu: 0.8`) would otherwise pass every build unnoticed."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None  # shown instead of the generated name (JUnit test case, reports)


class MinPassRateGate(GateModel):
    """The pass rate must reach `value`: for `variant`, for every variant when omitted, or over
    all variants with `overall: true`. By default its interval's lower bound must reach it (the
    run shows, with the run's confidence, that the rate is at least `value`); `use: estimate`
    judges the point estimate alone."""

    type: Literal["min_pass_rate"]
    value: float = Field(ge=0.0, le=1.0)
    variant: str | None = None
    overall: bool = False
    use: Literal["lower_bound", "estimate"] = "lower_bound"
    # What the interval treats as independent draws (as the comparison page's "Clusters").
    cluster: Literal["unit", "task", "tag"] = "unit"

    @model_validator(mode="after")
    def _reachable(self) -> MinPassRateGate:
        if self.use == "lower_bound" and self.value >= 1.0:
            raise ValueError(
                "an interval's lower bound never reaches 100%, so this gate could never pass: add "
                "`use: estimate` to require every graded trial to pass"
            )
        return self


class NoRegressionGate(GateModel):
    """No variant (or only `variant`) is worse than the baseline by `margin` or more, on evidence:
    a non-inferiority test. A variant passes when the lower bound of Δ's 95% interval (one-sided
    2.5%) is at least -margin, with the infrastructure errors as measured and with every one a
    fail. It fails when it shares fewer than `min_clusters` graded clusters with the baseline,
    when no valid comparison exists, and when the bound is below -margin (saying when the design
    could not detect the margin at all). The default margin, 5 pp, is the smallest regression a
    team acts on that suites of a few dozen tasks can show."""

    type: Literal["no_regression"]
    # The comparison's intervals are 95%: the one level the gate can judge at.
    alpha: float = Field(default=0.05, ge=0.05, le=0.05)
    variant: str | None = None
    margin: float = Field(default=NON_INFERIORITY_MARGIN, gt=0.0, le=1.0)
    min_clusters: int = Field(default=10, ge=2)
    cluster: Literal["unit", "task", "tag"] = "unit"


class MaxErrorShareGate(GateModel):
    """error / (passed + failed + error) must not exceed `value` (per variant, or overall)."""

    type: Literal["max_error_share"]
    value: float = Field(ge=0.0, le=1.0)
    variant: str | None = None
    overall: bool = False


class SuiteThresholdsGate(GateModel):
    """Every dataset suite (task × variant with suite_thresholds) met its thresholds."""

    type: Literal["suite_thresholds"]
    variant: str | None = None


Gate = Annotated[
    MinPassRateGate | NoRegressionGate | MaxErrorShareGate | SuiteThresholdsGate,
    Field(discriminator="type"),
]
GATE_TYPES = ("min_pass_rate", "no_regression", "max_error_share", "suite_thresholds")
GATE_MODELS: dict[str, type[GateModel]] = {
    "min_pass_rate": MinPassRateGate, "no_regression": NoRegressionGate,
    "max_error_share": MaxErrorShareGate, "suite_thresholds": SuiteThresholdsGate,
}  # fmt: skip


def gate_keys(gate: Any) -> list[str]:
    """The keys a gate of its type takes (every gate's, when its type is unknown)."""
    model = GATE_MODELS.get(str(gate.get("type"))) if isinstance(gate, dict) else None
    models = [model] if model is not None else list(GATE_MODELS.values())
    return sorted({name for each in models for name in each.model_fields})


def gate_issues(gates: list[Any], variants: dict[str, int]) -> list[tuple[tuple[str | int, ...], str]]:
    """Gates naming a variant the experiment lacks, or both a variant and `overall`."""
    issues: list[tuple[tuple[str | int, ...], str]] = []
    for i, gate in enumerate(gates):
        variant = gate.variant
        if variant is not None and variant not in variants:
            issues.append(
                (("gates", i, "variant"), f"no variant {variant!r}; expected one of: {', '.join(variants)}")
            )
        if getattr(gate, "overall", False) and variant is not None:
            issues.append((("gates", i, "overall"), "set either variant or overall: true, not both"))
    return issues
