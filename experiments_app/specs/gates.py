"""Pydantic models of evalsite's gates: checks evaluated when a run ends (no Django).

An experiment lists them under `gates`; they decide evalrun's exit code. `runs_app.analysis.gates` judges
them; `specs.ExperimentSpec` checks their variant names with `gate_issues`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class GateModel(BaseModel):
    """Base of the gate specs. Unlike other specs, unknown keys are errors: a mistyped gate key
    (`valeu: 0.8`) would otherwise pass every build unnoticed."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None  # shown instead of the generated name (JUnit test case, reports)


class MinPassRateGate(GateModel):
    """passed / (passed + failed) must reach `value`: for `variant`, for every variant when
    omitted, or pooled over all variants with `overall: true`."""

    type: Literal["min_pass_rate"]
    value: float = Field(ge=0.0, le=1.0)
    variant: str | None = None
    overall: bool = False


class NoRegressionGate(GateModel):
    """No variant (or only `variant`) is significantly worse than the baseline: fails when the
    Δ pass rate is negative and its Holm-adjusted p-value is below `alpha`."""

    type: Literal["no_regression"]
    alpha: float = Field(default=0.05, gt=0.0, lt=1.0)
    variant: str | None = None


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
