"""Pydantic models of coder-eval's success criteria (no Django).

Field names and parameters follow coder-eval (`coder_eval/criteria/*.py`); evalsite additions
are marked "evalsite:". A task lists them under `success_criteria`; `Criterion` is the tagged
union of every kind, derived from it: `CRITERION_MODELS` by `type` value, split by where a type
is graded (`graded_in`):

- `CRITERION_TYPES`: graded from the finished workspace and the recorded events, each by a family
  module of `runs_app.engine.criteria` (the engine refuses to start unless it covers exactly these);
- `CONTAINER_CRITERION_TYPES`: run inside the trial's container by the container driver after the
  agent (`verifier`, Harbor's tests/test.sh), for `sandbox.driver: docker` tasks only.

Adding a type: its model here (and in the union), its implementation in a family module of
`runs_app.engine.criteria` (docs/criteria.md), or in the container driver for a container type.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import PurePosixPath
from typing import Annotated, Any, ClassVar, Literal, get_args

import jmespath
from pydantic import Field, field_validator, model_validator

from experiments_app.specs.base import SpecError, SpecModel, check_regex, check_workspace_path, has_row_var
from experiments_app.specs.cli_recording import (
    RECORD_CLI_LOG,
    FlagMatch,
    facet_problems,
    lowered_spec,
    verb_problems,
)
from experiments_app.specs.docker import check_env, check_user


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
    # Where it is graded: from the finished workspace (a family module of runs_app.engine.criteria),
    # or inside the trial's container, by the container driver.
    graded_in: ClassVar[Literal["workspace", "container"]] = "workspace"

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
                    "command_executed and skill_triggered can",
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


# coder-eval's floor on a json_check `contains` literal (`_MIN_CONTAINS_LITERAL_LEN`).
MIN_CONTAINS_LITERAL = 8


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
        if (
            self.operator == "contains"
            and isinstance(self.expected, str)
            and not has_row_var(self.expected)
            and len(self.expected.strip()) < MIN_CONTAINS_LITERAL
        ):
            raise SpecError(
                (
                    ("expected",),
                    f"a 'contains' literal needs at least {MIN_CONTAINS_LITERAL} characters besides spaces, "
                    f"and {self.expected!r} has {len(self.expected.strip())} (coder-eval refuses it: a short "
                    "piece of a paraphrased value matches by luck): use operator regex with an anchored "
                    "pattern, or operator equals with the exact value",
                )
            )
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
    # coder-eval's; only its default (false) is accepted: true is refused by name (unbuilt.py).
    read_only: Literal[False] = False

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


class LiveCriterion(BaseCriterion):
    """A criterion decidable from a partial trajectory (coder-eval's LiveSuccessCriterion): the
    only kind a `stop_early` block may arm (`runs_app.engine.criteria.early_stop`)."""

    stop_early: StopEarlyPolicy | None = None

    requires_agent: ClassVar[bool] = True

    @model_validator(mode="after")
    def _armed_gates(self) -> LiveCriterion:
        if self.stop_early is not None and self.weight == 0:
            raise SpecError(
                (
                    ("stop_early",),
                    "weight 0 makes the criterion informational, so it cannot set a stop_early block "
                    "(which arms it for a pass/fail gate): give it a non-zero weight, or drop the block",
                )
            )
        return self


class CommandExecuted(LiveCriterion):
    type: Literal["command_executed"]
    tool_name: str | None = None
    command_pattern: str | None = None
    exclude_pattern: str | None = None
    min_count: int = Field(default=1, ge=0)
    max_count: int | None = Field(default=None, ge=0)
    require_success: bool = False

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


class SkillTriggered(LiveCriterion):
    """Did the agent engage `skill_name`: a `Skill` tool call naming it, or any string parameter
    of a call holding `skills/<skill_name>/` (an agent reading the skill's files). Observed "yes"
    or "no"; expected "yes" when `expected_skill` (a dataset row's, "" for negatives) is
    `skill_name`. Scores 1.0 when the two agree, with labels for the suite's classification
    metrics."""

    type: Literal["skill_triggered"]
    expected_skill: str
    skill_name: str


class CommandsEfficiency(BaseCriterion):
    """expected / max(actual, expected) over the agent's tool calls; 0.0 with none."""

    type: Literal["commands_efficiency"]
    expected_commands: int = Field(ge=1)

    requires_agent: ClassVar[bool] = True


class ReferenceComparison(BaseCriterion):
    """A workspace file against one file of the task's reference folder: `ast` (node types in
    walk order), `token` (token types) or `complexity` (radon metrics), each scored 0..1.
    `pass_threshold` is `similarity_threshold`, as in coder-eval."""

    type: Literal["reference_comparison"]
    agent_file: str
    reference_file: str
    comparison_method: Literal["ast", "token", "complexity"] = "ast"
    similarity_threshold: float = Field(default=0.8, ge=0.0, le=1.0)

    requires_agent: ClassVar[bool] = True

    @field_validator("agent_file")
    @classmethod
    def _agent_file(cls, v: str) -> str:
        return check_workspace_path(v, "agent_file")

    @field_validator("reference_file")
    @classmethod
    def _inside_reference(cls, v: str) -> str:
        cleaned = v.strip()
        if not cleaned:
            raise ValueError("must be a non-empty path inside the task's reference folder")
        candidate = PurePosixPath(cleaned.replace("\\", "/"))
        if candidate.is_absolute() or ".." in candidate.parts:
            raise ValueError(
                f"must be relative to the task's reference folder and stay inside it (no leading '/', "
                f"no '..'), got {v!r}"
            )
        return cleaned

    @model_validator(mode="after")
    def _threshold_is_similarity(self) -> ReferenceComparison:
        # coder-eval: similarity_threshold is the domain's name for the pass threshold, and wins.
        self.pass_threshold = self.similarity_threshold
        return self


class CliCalled(BaseCriterion):
    """How many calls in a `record_cli` log match an argv pattern; binary: 1.0 when the count is
    in [min_count, max_count]. An unreadable log (missing, a write error, a line that is not a
    record) fails the check rather than scoring what it holds."""

    type: Literal["cli_called"]
    log: str = RECORD_CLI_LOG
    verb: str | None = None
    verb_any_of: list[str] | None = None
    tool: str | None = None
    positional: list[str] | None = None
    flags: dict[str, FlagMatch] | None = None
    value_flags: list[str] = Field(default_factory=lambda: ["output"])
    min_count: int = Field(default=1, ge=0)
    max_count: int | None = Field(default=None, ge=0)
    ignore_flags: list[str] = Field(default_factory=lambda: ["output"])

    @field_validator("log")
    @classmethod
    def _log_in_workspace(cls, v: str) -> str:
        return check_workspace_path(v, "log")

    @model_validator(mode="after")
    def _pattern(self) -> CliCalled:
        problems = verb_problems(self.verb, self.verb_any_of, "cli_called")
        if self.min_count == 0 and self.max_count is None:
            problems.append(
                "min_count: 0 without max_count can never fail: set max_count: 0 for a guard, or raise "
                "min_count"
            )
        if self.max_count is not None and self.max_count < self.min_count:
            problems.append(f"max_count ({self.max_count}) must be >= min_count ({self.min_count})")
        problems += facet_problems(self.positional, self.flags, self.ignore_flags, "cli_called")
        if not (self.verb or self.verb_any_of or self.positional or self.flags or self.tool):
            problems.append("cli_called needs at least one of verb / verb_any_of / positional / flags / tool")
        if problems:
            raise SpecError(*((("type",), problem) for problem in problems))
        return self

    @property
    def match_spec(self) -> dict[str, Any]:
        return lowered_spec(
            self.verb, self.verb_any_of, self.positional, self.flags, self.value_flags, self.ignore_flags
        )


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


class JudgeAgent(SpecModel):
    """The agent an `agent_judge` runs: a Claude Code CLI (coder-eval's built-in judge kind). As in
    coder-eval, a block given must name its `type`."""

    type: Literal["claude-code"]
    model: str | None = None
    permission_mode: str = "bypassPermissions"
    allowed_tools: list[str] = Field(default_factory=lambda: ["Bash", "Read", "Glob", "Grep"])
    disallowed_tools: list[str] | None = None
    # Added to the security floor (`.claude`, `.mcp.json`, `_reference`), never replacing it.
    ignore_patterns: list[str] = Field(
        default_factory=lambda: [".git", "node_modules", "__pycache__", ".venv"]
    )
    sdk_options: dict[str, Any] = Field(default_factory=dict)
    context_window: int | None = Field(default=None, ge=100_000, le=1_000_000)
    max_retries: int | None = Field(default=None, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _fixed_by_the_harness(cls, data: Any) -> Any:
        fixed = {
            "system_prompt": "the judge's system prompt is the harness's",
            "system_prompt_file": "the judge's system prompt is the harness's",
            "system_prompt_mode": "the judge's system prompt always replaces Claude Code's",
            "setting_sources": "the judge loads no settings (a planted .claude/ must not reach it)",
            "plugins": "the judge loads no plugins",
            "claude_settings": "the judge loads no settings",
        }
        found = [
            ((key,), f"{why}: remove {key}")
            for key, why in fixed.items()
            if isinstance(data, dict) and key in data
        ]
        if found:
            raise SpecError(*found)
        return data


class AgentJudge(BaseCriterion):
    """A Claude Code agent grades the work in a copy of the workspace (coder-eval's agent_judge):
    it reads and runs what it needs, then calls `submit_verdict` (score 0..1, rationale,
    findings). Its model calls go through the trial's judge gateway, under `budgets.judge`."""

    type: Literal["agent_judge"]
    needs_model: ClassVar[bool] = True
    pass_threshold: float = Field(default=0.7, ge=0.0, le=1.0)
    enabled: bool = True
    prompt: str
    files: list[str] = Field(default_factory=list)
    include_reference: bool = True
    include_agent_output: bool = False
    include_tool_calls: bool = False
    include_dialog: bool = False
    max_dialog_chars: int = Field(default=80_000, gt=0)
    max_file_chars: int = Field(default=20_000, gt=0)
    max_turns: int = Field(default=50, gt=0)
    turn_timeout: int = Field(default=300, ge=10)
    agent: JudgeAgent = Field(default_factory=lambda: JudgeAgent(type="claude-code"))
    capture_transcript: bool = True
    max_transcript_chars: int = Field(default=100_000, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _verdict_channel_removed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "verdict_channel" in data:
            raise SpecError(
                (
                    ("verdict_channel",),
                    "removed in coder-eval: the submit_verdict tool is the only channel; delete it",
                )
            )
        return data


class Verifier(BaseCriterion):
    """evalsite: a verifier script run inside the trial's container after the agent, its score read
    from a reward file: Harbor's verifier (`tests/test.sh` writing `/logs/verifier/reward.txt` or
    `reward.json`). Container tasks only (`sandbox.driver: docker`); a Harbor task folder is
    imported with one of these.

    Parameters:
    - `tests_dir`: a folder beside the task file (it travels in the task's bundle, never in the
      image's build context); copied into the container at `/tests` after the agent.
    - `script`: the file of `tests_dir` to run (default `test.sh`), as `bash /tests/<script>`.
    - `timeout`: seconds the script may run (Harbor's `[verifier].timeout_sec`, default 600).
    - `env`: variables set for the script, over the container's own (`[verifier].env`).
    - `user`: who runs it (`[verifier].user`); None: the image's USER, as in Harbor.
    - `pass_threshold`: 1.0 by default (a reward passes only when full).

    Grading, in this order (the container driver implements it):
    1. After the agent phase (and `post_run`), in the same container: remove `/tests` and
       `/logs/verifier` if the agent left anything there; copy `tests_dir` to `/tests` (owned by
       root, not writable by the agent's user); create an empty `/logs/verifier` writable by
       `user`; run `bash /tests/<script>` in the working directory, as `user`, with `env`, for at
       most `timeout` seconds. Its exit code and output are kept in the result's details, and never
       scored (Harbor reads only the reward file).
    2. `/logs/verifier/reward.json`, when present, wins over `reward.txt` (Harbor's order). It must
       hold a JSON object whose values are numbers (booleans refused) in [0, 1]. Each key is one
       criterion result, named by the key, with this criterion's gating and `pass_threshold` and an
       equal share of its `weight` (so the verifier as a whole weighs `weight`).
    3. Otherwise `reward.txt` must hold one number in [0, 1] (whitespace around it allowed): the
       criterion's score, passed when score >= `pass_threshold`.
    4. No reward file, an empty or unreadable one, a value that is not such a number, or a script
       still running at `timeout` is a grading error (the trial is `error`, never `failed`), as
       Harbor raises RewardFileNotFoundError or VerifierTimeoutError rather than scoring 0.
    """

    type: Literal["verifier"]
    graded_in: ClassVar[Literal["workspace", "container"]] = "container"
    pass_threshold: float = Field(default=1.0, ge=0.0, le=1.0)
    tests_dir: str = "tests"
    script: str = "test.sh"
    timeout: int = Field(default=600, ge=1, le=24 * 3600)
    env: dict[str, str] = Field(default_factory=dict)
    user: str | int | None = None

    @field_validator("tests_dir")
    @classmethod
    def _tests_dir(cls, v: str) -> str:
        norm = v.replace("\\", "/")
        if not norm.strip() or norm.startswith(("/", "~")) or re.match(r"^[A-Za-z]:/", norm):
            raise ValueError(f"tests_dir must be a folder relative to the task file's, got {v!r}")
        return v

    @field_validator("script")
    @classmethod
    def _script(cls, v: str) -> str:
        return check_workspace_path(v, "script (a file of tests_dir)")

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return check_env(v, "env")

    @field_validator("user")
    @classmethod
    def _user(cls, v: str | int | None) -> str | int | None:
        return check_user(v, "user")


Criterion = Annotated[
    FileExists
    | FileContains
    | FileMatchesRegex
    | FileCheck
    | JsonCheck
    | RunCommand
    | CommandExecuted
    | SkillTriggered
    | CommandsEfficiency
    | ReferenceComparison
    | CliCalled
    | ClassificationMatch
    | LlmJudge
    | AgentJudge
    | Verifier,
    Field(discriminator="type"),
]
# The one list of criterion types: the union's members, by their `type` value.
CRITERION_MODELS: dict[str, type[BaseCriterion]] = {
    get_args(model.model_fields["type"].annotation)[0]: model for model in get_args(get_args(Criterion)[0])
}
ALL_CRITERION_TYPES = tuple(CRITERION_MODELS)
# Graded from the workspace: the engine's family modules (`runs_app.engine.criteria`) cover exactly these.
CRITERION_TYPES = tuple(name for name, model in CRITERION_MODELS.items() if model.graded_in == "workspace")
# Graded inside the trial's container by the container driver.
CONTAINER_CRITERION_TYPES = tuple(
    name for name, model in CRITERION_MODELS.items() if model.graded_in == "container"
)
# Types whose grading asks a model (the judge's gateway and budget).
MODEL_CRITERIA = frozenset(name for name, model in CRITERION_MODELS.items() if model.needs_model)


def verifier_rewards(reward_json: bytes | None, reward_txt: bytes | None) -> dict[str, float]:
    """A `verifier` criterion's rewards, by name, from what its script left in /logs/verifier
    (the bytes of reward.json and reward.txt, None for a file that is absent): reward.json's keys
    when it exists, else {"reward": the number in reward.txt} (Harbor's name for it). Raises
    ValueError naming what is wrong; the grader reports that as an error, never as a score."""
    if reward_json is not None:
        try:
            data = json.loads(reward_json.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"reward.json is not JSON: {exc}") from None
        if not isinstance(data, dict) or not data:
            raise ValueError(
                'reward.json must hold a JSON object of reward names to numbers, e.g. {"tests": 1}'
            )
        return {str(name): _reward(value, f"reward.json: {name!r}") for name, value in data.items()}
    if reward_txt is not None:
        text = reward_txt.decode("utf-8", errors="replace").strip()
        if not text:
            raise ValueError("reward.txt is empty: the verifier must write one number from 0 to 1")
        try:
            number = float(text)
        except ValueError:
            raise ValueError(f"reward.txt must hold one number from 0 to 1, got {text[:40]!r}") from None
        return {"reward": _reward(number, "reward.txt")}
    raise ValueError(
        "the verifier wrote neither /logs/verifier/reward.json nor reward.txt (Harbor's "
        "RewardFileNotFoundError)"
    )


def _reward(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{where} must be a number from 0 to 1, got {value!r}")
    if not 0 <= value <= 1:
        raise ValueError(f"{where} is {value}, outside [0, 1] (a score is never clamped)")
    return float(value)


def default_pass_threshold(criterion_type: str) -> float:
    return float(CRITERION_MODELS[criterion_type].model_fields["pass_threshold"].default)
