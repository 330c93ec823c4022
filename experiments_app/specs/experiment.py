"""Pydantic models of coder-eval's experiment YAML and of resolution layers (no Django).

A layer (`TaskOverlay`) is a partial task config: experiment `defaults`, a variant, or run
overrides. `TASK_FIELDS` and `LAYER_FIELDS` name the fields a task and a layer may set.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from experiments_app.specs.base import SpecError, SpecModel
from experiments_app.specs.criteria import ALL_CRITERION_TYPES, Criterion
from experiments_app.specs.gates import GATE_TYPES, Gate, gate_issues
from experiments_app.specs.task import (
    KEBAB_RE,
    AgentSpec,
    Budgets,
    HooksSpec,
    PostRunCommand,
    PreRunCommand,
    PromptMutation,
    ReferenceSpec,
    RunLimits,
    SandboxSpec,
    SimulationSpec,
    TaskSpec,
    TemplateSource,
    _slug,
    check_template_sources,
)
from experiments_app.specs.unbuilt import refuse_unbuilt

# --- layers and experiments ----------------------------------------------------------------


class TaskOverlay(SpecModel):
    """A partial task config: one resolution layer (experiment defaults, a variant, run overrides).

    Every field is optional. coder-eval's experiment layers may also write `template_sources`
    and `driver` at their top level (they apply to the sandbox), `prompt_mutations` and `repeats`.
    """

    initial_prompt: str | None = None
    initial_prompt_file: str | None = None
    agent: AgentSpec | None = None
    sandbox: SandboxSpec | None = None
    success_criteria: list[Criterion] | None = None
    run_limits: RunLimits | None = None
    pre_run: list[PreRunCommand] | None = None
    post_run: list[PostRunCommand] | None = None
    hooks: HooksSpec | None = None
    budgets: Budgets | None = None
    reference: ReferenceSpec | None = None
    simulation: SimulationSpec | None = None
    expected_commands: int | None = Field(default=None, ge=1)
    template_sources: list[TemplateSource] | None = None
    driver: Literal["tempdir", "docker"] | None = None
    prompt_mutations: list[PromptMutation] | None = None
    repeats: int | None = Field(default=None, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _refuse_unbuilt(cls, data: Any) -> Any:
        return refuse_unbuilt(data)

    @model_validator(mode="after")
    def _sources(self) -> TaskOverlay:
        check_template_sources(self.template_sources or [], ("template_sources",))
        return self


class VariantSpec(TaskOverlay):
    variant_id: str
    description: str = ""

    @field_validator("variant_id")
    @classmethod
    def _variant_id(cls, v: str) -> str:
        return _slug(v, "variant_id")

    @model_validator(mode="after")
    def _one_prompt_change(self) -> VariantSpec:
        given = [
            name
            for name in ("prompt_mutations", "initial_prompt", "initial_prompt_file")
            if getattr(self, name) is not None
        ]
        if len(given) > 1:
            raise SpecError(((given[1],), f"set only one of {', '.join(given)} in a variant"))
        if self.hooks is not None and self.hooks.suite is not None:
            raise SpecError(
                (
                    ("hooks", "suite"),
                    "hooks.suite runs once per run, for every variant: set it in the experiment's "
                    "defaults, not in a variant",
                )
            )
        return self


class ExperimentSpec(SpecModel):
    """One coder-eval experiment, plus evalsite's task selection and scheduling fields."""

    experiment_id: str
    description: str = ""
    defaults: TaskOverlay = Field(default_factory=TaskOverlay)
    variants: list[VariantSpec] = Field(min_length=1)
    # evalsite: which tasks to run (task set names; tags to include / exclude).
    task_sets: list[str] = Field(default_factory=list)
    tags: list[str] = Field(default_factory=list)
    exclude_tags: list[str] = Field(default_factory=list)
    max_parallel: int = Field(default=4, ge=1)
    baseline: str | None = None  # a variant_id; the first variant when omitted
    # evalsite: checks evaluated when a run ends; they decide evalrun's exit code.
    gates: list[Gate] = Field(default_factory=list)

    @field_validator("defaults", mode="before")
    @classmethod
    def _no_defaults(cls, v: Any) -> Any:
        return {} if v is None else v  # coder-eval allows `defaults: null`

    @field_validator("experiment_id")
    @classmethod
    def _experiment_id(cls, v: str) -> str:
        if not KEBAB_RE.match(v):
            raise ValueError(f"experiment_id {v!r} must be kebab-case (e.g. 'model-comparison')")
        return v

    @model_validator(mode="after")
    def _variants(self) -> ExperimentSpec:
        issues: list[tuple[tuple[str | int, ...], str]] = []
        seen: dict[str, int] = {}
        for i, variant in enumerate(self.variants):
            if variant.variant_id in seen:
                msg = (
                    f"duplicate variant_id {variant.variant_id!r} (also variants[{seen[variant.variant_id]}])"
                )
                issues.append((("variants", i, "variant_id"), msg))
            seen.setdefault(variant.variant_id, i)
        if self.baseline is None:
            self.baseline = self.variants[0].variant_id
        elif self.baseline not in seen:
            issues.append(
                (("baseline",), f"no variant {self.baseline!r}; expected one of: {', '.join(seen)}")
            )
        issues += gate_issues(self.gates, seen)
        if issues:
            raise SpecError(*issues)
        return self


TASK_FIELDS: tuple[str, ...] = tuple(TaskSpec.model_fields)
LAYER_FIELDS: tuple[str, ...] = tuple(TaskOverlay.model_fields)
# Names pydantic may insert into an error location for a tagged union (not YAML keys).
UNION_TAGS = frozenset(
    (
        *ALL_CRITERION_TYPES,
        *GATE_TYPES,
        "template_dir",
        "starter_files",
        "repo",
        "prefix",
        "suffix",
        "replace",
        "template",
    )
)
