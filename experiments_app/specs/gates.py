"""Pydantic models of evalsite's gates: checks evaluated when a run ends (no Django).

An experiment lists them under `gates`; they decide evalrun's exit code.
`runs_app.analysis.stats.gates` judges them; `specs.ExperimentSpec` checks their variant names
with `gate_issues`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


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
    """No variant (or only `variant`) is worse than the baseline, on evidence.

    Fails when a variant shares fewer than `min_clusters` graded clusters with the baseline
    (too little evidence to say), when no valid test compares them, and then either when Δ is
    negative with a Holm-adjusted p below `alpha`, or, with a `margin` (non-inferiority), when
    the lower bound of Δ's interval is below -margin."""

    type: Literal["no_regression"]
    alpha: float = Field(default=0.05, gt=0.0, lt=1.0)
    variant: str | None = None
    margin: float | None = Field(default=None, gt=0.0, le=1.0)
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
