"""Pydantic models of coder-eval's success criteria (no Django).

Field names and parameters follow coder-eval (`coder_eval/criteria/*.py`); evalsite additions
are marked "evalsite:". A task lists them under `success_criteria`; `Criterion` is the tagged
union of every kind and `CRITERION_TYPES` their `type` values, derived from it.

Adding a type: its model here (and in the union), its implementation in a family module of
`runs_app.engine.criteria` (docs/criteria.md).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, get_args

import jmespath
from pydantic import Field, field_validator, model_validator

from experiments_app.specs.base import SpecError, SpecModel, check_regex, check_workspace_path, has_row_var


class BaseCriterion(SpecModel):
    type: str
    description: str = ""
    # 0 = informational: left out of the score and (unless `gating` says otherwise) of pass/fail.
    weight: float = Field(default=1.0, ge=0.0, allow_inf_nan=False)
    pass_threshold: float = Field(default=0.9, ge=0.0, le=1.0)
    # evalsite: None means "gating when weight > 0" (coder-eval's rule).
    gating: bool | None = None
    # Across-row minimums for dataset tasks, e.g. {accuracy: 0.8}.
    suite_thresholds: dict[str, float] | None = None

    # Criteria that read the agent's trajectory (meaningless without an agent).
    requires_agent: ClassVar[bool] = False
    # Criteria whose grading asks a model (through the judge's gateway, under `budgets.judge`).
    needs_model: ClassVar[bool] = False

    @property
    def is_gating(self) -> bool:
        return self.gating if self.gating is not None else self.weight > 0

    @model_validator(mode="before")
    @classmethod
    def _only_live_criteria_arm(cls, data: Any) -> Any:
        if isinstance(data, dict) and "stop_early" in data and "stop_early" not in cls.model_fields:
            raise SpecError(
                (
                    ("stop_early",),
                    "stop_early arms a criterion that can be decided while the agent runs, and only "
                    "command_executed can (coder-eval's other one, skill_triggered, is not built)",
                )
            )
        return data

    @model_validator(mode="after")
    def _path_in_workspace(self) -> BaseCriterion:
        path = getattr(self, "path", None)
        if isinstance(path, str):
            try:
                check_workspace_path(path)
            except ValueError as exc:
                raise SpecError((("path",), str(exc))) from None
        return self

    @model_validator(mode="after")
    def _informational_has_no_suite_gate(self) -> BaseCriterion:
        if self.weight == 0 and self.suite_thresholds is not None:
            raise SpecError(
                (("suite_thresholds",), "a weight 0 (informational) criterion cannot set suite_thresholds")
            )
        return self


class FileExists(BaseCriterion):
    type: Literal["file_exists"]
    path: str


class FileContains(BaseCriterion):
    type: Literal["file_contains"]
    path: str
    includes: list[str]
    excludes: list[str] | None = None


class FileMatchesRegex(BaseCriterion):
    type: Literal["file_matches_regex"]
    path: str
    pattern: str
    must_match: bool = True
    flags: int = 0

    @model_validator(mode="after")
    def _regex(self) -> FileMatchesRegex:
        try:
            check_regex(self.pattern, self.flags)
        except ValueError as exc:
            raise SpecError((("pattern",), str(exc))) from None
        return self


class RegexPattern(SpecModel):
    pattern: str
    must_match: bool = True
    flags: int = 0

    @model_validator(mode="after")
    def _regex(self) -> RegexPattern:
        try:
            check_regex(self.pattern, self.flags)
        except ValueError as exc:
            raise SpecError((("pattern",), str(exc))) from None
        return self


class FileCheck(BaseCriterion):
    type: Literal["file_check"]
    path: str
    includes: list[str] = Field(default_factory=list)
    excludes: list[str] = Field(default_factory=list)
    patterns: list[RegexPattern] = Field(default_factory=list)


JSON_OPERATORS = ("equals", "not_equals", "contains", "gt", "gte", "lt", "lte", "type", "regex", "exists")


class JsonAssertion(SpecModel):
    expression: str = Field(description="JMESPath expression")
    operator: Literal[JSON_OPERATORS] = "equals"  # type: ignore[valid-type]
    expected: Any = None

    @field_validator("expression")
    @classmethod
    def _jmespath(cls, v: str) -> str:
        if not has_row_var(v):
            try:
                jmespath.compile(v)
            except jmespath.exceptions.JMESPathError as exc:
                detail = " ".join(str(exc).split())  # jmespath's message spans lines with a caret
                raise ValueError(f"invalid JMESPath expression {v!r}: {detail}") from None
        return v

    @model_validator(mode="after")
    def _expected_given(self) -> JsonAssertion:
        # `expected: null` is a valid JSON value, so "given" means "the key is present".
        if self.operator != "exists" and "expected" not in self.model_fields_set:
            raise SpecError((("expected",), f"required when operator is {self.operator!r}"))
        if self.operator == "regex" and isinstance(self.expected, str):
            try:
                check_regex(self.expected)
            except ValueError as exc:
                raise SpecError((("expected",), str(exc))) from None
        return self


class JsonCheck(BaseCriterion):
    type: Literal["json_check"]
    path: str
    json_schema: str | None = None
    assertions: list[JsonAssertion] = Field(default_factory=list)


class RunCommand(BaseCriterion):
    type: Literal["run_command"]
    command: str
    timeout: int = Field(default=30, gt=0)
    expected_exit_code: int = 0
    expected_stdout: str | None = None
    stdout_match: Literal["exact", "contains", "regex"] = "exact"
    score_from_stdout: bool = False

    @model_validator(mode="after")
    def _stdout(self) -> RunCommand:
        if self.score_from_stdout and self.expected_stdout is not None:
            raise SpecError(
                (("score_from_stdout",), "score_from_stdout and expected_stdout are mutually exclusive")
            )
        if self.stdout_match == "regex" and self.expected_stdout is not None:
            try:
                check_regex(self.expected_stdout)
            except ValueError as exc:
                raise SpecError((("expected_stdout",), str(exc))) from None
        return self


class StopEarlyPolicy(SpecModel):
    """coder-eval's per-criterion early stop: the block's presence arms the criterion, so a live
    fail may end the agent's run; `on_pass: stop` lets a live pass end it too; `decide_within`
    counts a criterion still undecided after N tool calls as failed."""

    on_pass: Literal["stop", "continue"] = "continue"
    decide_within: int | None = Field(default=None, ge=1, le=100_000)


class CommandExecuted(BaseCriterion):
    type: Literal["command_executed"]
    tool_name: str | None = None
    command_pattern: str | None = None
    exclude_pattern: str | None = None
    min_count: int = Field(default=1, ge=0)
    max_count: int | None = Field(default=None, ge=0)
    require_success: bool = False
    # The one criterion decidable from a partial trajectory (coder-eval's LiveSuccessCriterion;
    # its other one, skill_triggered, is not built), so the only one that may be armed.
    stop_early: StopEarlyPolicy | None = None

    requires_agent: ClassVar[bool] = True

    @model_validator(mode="after")
    def _armed_gates(self) -> CommandExecuted:
        if self.stop_early is not None and self.weight == 0:
            raise SpecError(
                (
                    ("stop_early",),
                    "weight 0 makes the criterion informational, so it cannot set a stop_early block "
                    "(which arms it for a pass/fail gate): give it a non-zero weight, or drop the block",
                )
            )
        return self

    @model_validator(mode="after")
    def _counts(self) -> CommandExecuted:
        issues = []
        for name in ("command_pattern", "exclude_pattern"):
            value = getattr(self, name)
            if value is not None:
                try:
                    check_regex(value)
                except ValueError as exc:
                    issues.append(((name,), str(exc)))
        if self.max_count is not None and self.max_count < self.min_count:
            issues.append((("max_count",), f"must be >= min_count ({self.min_count})"))
        if issues:
            raise SpecError(*issues)
        return self


class ClassificationMatch(BaseCriterion):
    type: Literal["classification_match"]
    path: str
    expected_label: str
    allowed_labels: list[str] = Field(min_length=1)
    case_sensitive: bool = False


class LlmJudge(BaseCriterion):
    type: Literal["llm_judge"]
    needs_model: ClassVar[bool] = True
    # Judges rarely give 1.0 even to excellent work (coder-eval's default).
    pass_threshold: float = Field(default=0.7, ge=0.0, le=1.0)
    enabled: bool = True
    prompt: str
    # Sandbox-relative; "$TASK_DIR/x" reads x next to the task YAML, "$REFERENCE_DIR/x" the reference.
    files: list[str] = Field(default_factory=list)
    include_reference: bool = True
    include_agent_output: bool = False
    include_tool_calls: bool = False
    include_dialog: bool = False
    model: str | None = None
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    max_tokens: int = Field(default=2000, gt=0)
    max_file_chars: int = Field(default=20_000, gt=0)
    max_dialog_chars: int = Field(default=80_000, gt=0)
    capture_transcript: bool = True


Criterion = Annotated[
    FileExists
    | FileContains
    | FileMatchesRegex
    | FileCheck
    | JsonCheck
    | RunCommand
    | CommandExecuted
    | ClassificationMatch
    | LlmJudge,
    Field(discriminator="type"),
]
# The one list of criterion types: the union's members, by their `type` value. The engine's
# implementations (`runs_app.engine.criteria`) must cover exactly these.
CRITERION_MODELS: dict[str, type[BaseCriterion]] = {
    get_args(model.model_fields["type"].annotation)[0]: model for model in get_args(get_args(Criterion)[0])
}
CRITERION_TYPES = tuple(CRITERION_MODELS)
# Types whose grading asks a model (the judge's gateway and budget).
MODEL_CRITERIA = frozenset(name for name, model in CRITERION_MODELS.items() if model.needs_model)


def default_pass_threshold(criterion_type: str) -> float:
    return float(CRITERION_MODELS[criterion_type].model_fields["pass_threshold"].default)
