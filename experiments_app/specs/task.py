"""Pydantic models of coder-eval's task YAML format (no Django).

The field names and parameters follow coder-eval (`src/coder_eval/models/*.py`,
`coder_eval/criteria/*.py`); evalsite additions are marked "evalsite:".

Conventions:
- Every model keeps unknown keys (`extra="allow"`); the loader reports them as warnings.
  Inside `agent` unknown keys are agent options (sdk_options, allowed_tools, ...) and
  are not reported.
- Paths stay as written: relative to the folder of the YAML that holds them.
- Cross-field checks raise `SpecError`, which names the offending field, so the loader
  can point at its line.
"""

from __future__ import annotations

import ipaddress
import re
from importlib.metadata import entry_points
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AliasChoices, Field, StrictBool, ValidationInfo, field_validator, model_validator

from experiments_app.specs import agent_kinds, claude_options
from experiments_app.specs.base import SpecError, SpecModel, check_regex, check_workspace_path
from experiments_app.specs.cli_recording import RecordedCli, duplicate_tools
from experiments_app.specs.criteria import Criterion
from experiments_app.specs.docker import DockerSpec, check_env
from experiments_app.specs.unbuilt import refuse_unbuilt

AGENTLESS_KINDS = agent_kinds.AGENTLESS_KINDS

SLUG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
# coder-eval's task ids may hold dots (`my.task`); never two in a row, never first or last, so an
# id is always a plain folder name.
TASK_ID_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_-]|\.(?!\.))*(?<!\.)$")
KEBAB_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
# coder-eval's tag rule: kebab-case, optionally namespaced as "key:value".
TAG_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*(:[a-z0-9]+(-[a-z0-9]+)*)?$")
# coder-eval's dataset row id rule (row ids become folder names).
ROW_ID_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
ROW_VAR_RE = re.compile(r"\$\{row\.([A-Za-z_][A-Za-z0-9_]*)\}")
TASK_DIR_TOKEN = "$TASK_DIR/"
REFERENCE_DIR_TOKEN = "$REFERENCE_DIR"


HOST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$")


def _local_host(host: str) -> bool:
    """A name or address of the worker itself or of its private network."""
    if host.lower() in ("localhost", "localhost.localdomain") or host.lower().endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_private or address.is_link_local or address.is_unspecified


def _check_relative(path: str, what: str) -> str:
    norm = path.replace("\\", "/")
    if not norm or norm.startswith("/") or re.match(r"^[A-Za-z]:/", norm):
        raise ValueError(f"{what} must be a relative path, got {path!r}")
    if ".." in norm.split("/"):
        raise ValueError(f"{what} must not contain '..', got {path!r}")
    return path


# --- agent -------------------------------------------------------------------------------


CLAUDE_KIND = "claude-code"


class AgentSpec(SpecModel):
    """Agent kind, model and options. `type` may come from another layer (experiment defaults)."""

    type: str | None = None
    model: str | None = None
    system_prompt_file: str | None = None
    working_directory_preamble: StrictBool | None = None

    @field_validator("type")
    @classmethod
    def _known_kind(cls, v: str | None) -> str | None:
        return v if v is None else agent_kinds.check_kind(v)

    @model_validator(mode="after")
    def _options_of_the_kind(self, info: ValidationInfo) -> AgentSpec:
        # Options of another kind are refused where the block names its kind; once resolved,
        # an experiment's defaults may reach a variant of another kind (coder-eval accepts
        # that), so only options no kind has are refused there.
        resolved = bool((info.context or {}).get("resolved"))
        kind = None if resolved else self.type
        keys = [*(self.model_extra or {}), *(["system_prompt_file"] if self.system_prompt_file else [])]
        if self.working_directory_preamble is not None:
            keys.append(agent_kinds.PREAMBLE_OPTION)
        problems: list[tuple[tuple[str | int, ...], str]] = [
            ((key,), message) for key, message in agent_kinds.option_problems(kind, keys)
        ]
        if self.system_prompt_file is not None and (self.model_extra or {}).get("system_prompt") is not None:
            problems.append(
                (
                    ("system_prompt_file",),
                    "give system_prompt or system_prompt_file, not both (coder-eval refuses both): "
                    "remove one",
                )
            )
        if self.type in (None, CLAUDE_KIND):
            options = {"system_prompt_file": self.system_prompt_file, **(self.model_extra or {})}
            problems += claude_options.problems(options, resolved=resolved)
        if problems:
            raise SpecError(*problems)
        return self


# --- sandbox -----------------------------------------------------------------------------


class StarterFile(SpecModel):
    path: str
    content: str

    @field_validator("path")
    @classmethod
    def _relative(cls, v: str) -> str:
        return _check_relative(v, "starter file path")


class TemplateDirSource(SpecModel):
    type: Literal["template_dir"]
    path: str = Field(description="Folder copied into the sandbox, relative to the YAML's folder")
    mount_point: str = "."
    include_patterns: list[str] = Field(default_factory=list)

    @field_validator("mount_point")
    @classmethod
    def _mount_relative(cls, v: str) -> str:
        return v if v == "." else _check_relative(v, "mount_point")


class StarterFilesSource(SpecModel):
    type: Literal["starter_files"]
    files: list[StarterFile]


def repo_url_problem(url: str) -> str | None:
    """Why a repo source's URL is refused: only https URLs (a repository on the network, reached
    through the sandbox's proxy), never a path or file:// URL of the worker's own disk. Checked at
    import and again by the worker (an override could set it)."""
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.hostname:
        return (
            f"repo url {url!r} is not allowed: give an https:// URL (local paths, file://, ssh and "
            "other schemes could read the worker's own files)"
        )
    return None


class RepoSource(SpecModel):
    type: Literal["repo"]
    url: str
    commit: str | None = None
    ref: str | None = None  # evalsite: a branch or tag, when no commit is pinned

    @field_validator("url")
    @classmethod
    def _https(cls, v: str) -> str:
        if problem := repo_url_problem(v):
            raise ValueError(problem)
        return v


TemplateSource = Annotated[TemplateDirSource | StarterFilesSource | RepoSource, Field(discriminator="type")]


def check_template_sources(sources: list[Any], prefix: tuple[str | int, ...]) -> None:
    """coder-eval: at most one repo source, and it must come first (git clone needs an empty dir)."""
    repos = [i for i, s in enumerate(sources) if isinstance(s, RepoSource)]
    if len(repos) > 1:
        raise SpecError(((*prefix, repos[1], "type"), "only one repo template source is allowed"))
    if repos and repos[0] != 0:
        raise SpecError(((*prefix, repos[0], "type"), "a repo template source must be the first one"))


class PythonEnv(SpecModel):
    env_packages: list[str] = Field(default_factory=list)


class NodeEnv(SpecModel):
    env_packages: list[str] = Field(default_factory=list)


class ResourceLimits(SpecModel):
    timeout: int = Field(default=300, gt=0)
    max_memory_mb: int | None = Field(default=None, gt=0)
    max_cpus: float | None = Field(default=None, gt=0)
    max_pids: int | None = Field(default=None, gt=0)
    max_disk_mb: int | None = Field(default=None, gt=0)
    # evalsite: files and folders the trial may hold (its workspace, HOME and /tmp together).
    max_inodes: int | None = Field(default=None, gt=0)


class SandboxSpec(SpecModel):
    driver: Literal["tempdir", "docker"] = "tempdir"
    # Read only under driver: docker, as in coder-eval (an experiment may set it for every task).
    docker: DockerSpec = Field(default_factory=DockerSpec)
    # null in YAML skips the per-sandbox venv (coder-eval).
    python: PythonEnv | None = Field(default_factory=PythonEnv)
    node: NodeEnv | None = None
    limits: ResourceLimits = Field(default_factory=ResourceLimits)
    template_sources: list[TemplateSource] | None = None
    mock_path_dirs: list[str] | None = None
    # coder-eval's recording shims, read by cli_called (`cli_recording`).
    record_cli: list[RecordedCli] | None = None
    ignore_patterns: list[str] = Field(
        default_factory=list, validation_alias=AliasChoices("ignore_patterns", "additional_ignore_patterns")
    )
    # evalsite: no network but the model by default; `bridge` (coder-eval's name for egress)
    # reaches only the hosts listed in allowed_hosts, through the gateway's CONNECT proxy.
    network: Literal["none", "bridge"] = "none"
    allowed_hosts: list[str] = Field(default_factory=list)

    @field_validator("mock_path_dirs")
    @classmethod
    def _mock_dirs_in_workspace(cls, v: list[str] | None) -> list[str] | None:
        for path in v or []:
            check_workspace_path(path, "mock_path_dirs entry")
        return v

    @field_validator("allowed_hosts")
    @classmethod
    def _public_hosts(cls, hosts: list[str]) -> list[str]:
        for host in hosts:
            if not HOST_RE.match(host) or _local_host(host):
                raise ValueError(
                    f"allowed host {host!r} must be a public host name or address (no scheme, port, "
                    "localhost or private address: the worker's own services are never reachable)"
                )
        return hosts

    @model_validator(mode="after")
    def _sources(self) -> SandboxSpec:
        check_template_sources(self.template_sources or [], ("template_sources",))
        if duplicated := duplicate_tools(self.record_cli or []):
            raise SpecError(*(((("record_cli", *loc), message)) for loc, message in duplicated))
        if self.network == "bridge" and not self.allowed_hosts:
            raise SpecError(
                (("network",), "network: bridge needs allowed_hosts: list the hosts the task may reach "
                 "(evalsite gives no open internet)")
            )  # fmt: skip
        if self.allowed_hosts and self.network != "bridge":
            raise SpecError((("allowed_hosts",), "allowed_hosts needs network: bridge"))
        return self


# --- limits, commands, reference, dataset --------------------------------------------------


class RunLimits(SpecModel):
    """Caps that end a trial (coder-eval's `run_limits`). Every field optional."""

    # evalsite: upper bounds, so a typo (1e29) is refused at import rather than crashing a worker.
    max_turns: int | None = Field(default=None, gt=0, le=10_000)
    expected_turns: int | None = Field(default=None, ge=1, le=10_000)
    task_timeout: int | None = Field(default=None, ge=30, le=7 * 24 * 3600)
    turn_timeout: int | None = Field(default=None, ge=10, le=24 * 3600)
    max_input_tokens: int | None = Field(default=None, ge=1, le=10**12)
    max_output_tokens: int | None = Field(default=None, ge=1, le=10**12)
    max_total_tokens: int | None = Field(default=None, ge=1, le=10**12)
    max_usd: float | None = Field(default=None, gt=0.0, le=1_000_000.0, allow_inf_nan=False)
    count_cached_input: bool = False
    count_cache_creation: bool = False
    stop_early: bool | None = None
    stop_early_gate_threshold: float = Field(default=1.0, ge=0.0, le=1.0)
    # evalsite: tool calls the agent may make; the next one stops it (graded, flagged).
    max_tool_calls: int | None = Field(default=None, ge=1, le=100_000)


class RoleBudget(SpecModel):
    """evalsite: what the model calls the worker makes for one role of a trial may spend; the
    next call past it is refused."""

    max_input_tokens: int | None = Field(default=None, ge=1, le=10**12)
    max_output_tokens: int | None = Field(default=None, ge=1, le=10**12)
    max_total_tokens: int | None = Field(default=None, ge=1, le=10**12)
    max_usd: float | None = Field(default=None, gt=0.0, le=1_000_000.0, allow_inf_nan=False)
    max_calls: int | None = Field(default=None, ge=1, le=100_000)


class Budgets(SpecModel):
    """evalsite: budgets by role. The agent's own budget is `run_limits`; the simulated user's
    (`answerer`: a conversation it cannot go on with ends, and is graded) and the judge's
    (`judge`: a refused llm_judge call makes the trial an error) are set here."""

    answerer: RoleBudget | None = None
    judge: RoleBudget | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_agent(cls, data: Any) -> Any:
        if isinstance(data, dict) and "agent" in data:
            raise SpecError(
                (
                    ("agent",),
                    "the agent's budget is run_limits (max_total_tokens, max_usd, max_turns...): "
                    "budgets names the other roles, answerer and judge",
                )
            )
        return data


class PreRunCommand(SpecModel):
    command: str
    timeout: int = Field(default=30, ge=1, le=300)
    # A failing setup command makes the trial an error: the agent must not run on a broken sandbox.
    fail_on_error: bool = True


class PostRunCommand(SpecModel):
    command: str
    timeout: int = Field(default=30, ge=1, le=300)


class HookCommand(SpecModel):
    command: str
    timeout: int = Field(default=60, ge=1, le=3600)


class TrialHooks(SpecModel):
    """evalsite: commands around each trial, in its sandbox. `before` runs once the workspace is
    ready (after pre_run); `after` runs whatever happened since (a failed agent, a failed
    `before`, a cancel). A failing hook makes the trial an error, never a fail."""

    before: list[HookCommand] = Field(default_factory=list)
    after: list[HookCommand] = Field(default_factory=list)


class SuiteHooks(SpecModel):
    """evalsite: commands once per run, on the worker host that runs its trials, in a sandbox of
    their own whose folder every trial sees read-only at $EVALSITE_SUITE_DIR. What `setup` leaves
    running (a fixture service on a unix socket in that folder) keeps running until `teardown`,
    which runs in the same sandbox once the run has ended, whatever happened (also after a failed
    setup). A failed setup makes every trial of the run an error, never a fail."""

    setup: list[HookCommand] = Field(default_factory=list)
    teardown: list[HookCommand] = Field(default_factory=list)
    # Files and folders (beside the experiment's YAML) the commands use: they travel in the
    # experiment's bundle and are copied into the suite's folder.
    files: list[str] = Field(default_factory=list)

    @field_validator("files")
    @classmethod
    def _relative(cls, v: list[str]) -> list[str]:
        return [_check_relative(path, "hooks.suite.files entry") for path in v]


class HooksSpec(SpecModel):
    trial: TrialHooks | None = None
    # Set only in an experiment's defaults: a task or variant cannot change what a whole run shares.
    suite: SuiteHooks | None = None


class IntegritySpec(SpecModel):
    """evalsite: workspace paths (globs, e.g. `tests/**`) the agent must leave as the task set them
    up. The harness reads them before the agent and again before grading; a trial that changed,
    added or removed one fails, flagged `tampered`, with the diff."""

    protected: list[str] = Field(min_length=1)

    @field_validator("protected")
    @classmethod
    def _relative(cls, v: list[str]) -> list[str]:
        return [_check_relative(path, "integrity.protected entry") for path in v]


# The answerers built in (`runs_app.engine.simulation.answerers`); packages add others with an entry point in
# this group.
BUILTIN_ANSWERERS = ("persona", "scripted")
ANSWERER_ENTRY_POINT_GROUP = "evalsite.answerers"


def known_answerers() -> list[str]:
    plugins = {ep.name for ep in entry_points(group=ANSWERER_ENTRY_POINT_GROUP)} - set(BUILTIN_ANSWERERS)
    return [*BUILTIN_ANSWERERS, *sorted(plugins)]


# Agent kinds that can continue their session with the simulated user's reply.
RESUMABLE_KINDS = agent_kinds.RESUMABLE_KINDS


class SimulationSpec(SpecModel):
    """coder-eval's simulated user: after each agent turn an answerer reads the agent's reply and
    answers it, until it says the stop token or `max_turns` agent turns have run; then the trial
    is graded. evalsite: `answerer` names who answers (`persona`: an LLM playing `persona` with
    `goal`; `scripted`: `answers` in order, the stop token after the last; or an installed
    plugin), and defaults to `scripted` when `answers` are given, else `persona`."""

    enabled: bool = False
    model: str | None = None
    persona: str | None = None
    goal: str | None = None
    constraints: list[str] = Field(default_factory=list)
    max_turns: int = Field(default=8, ge=1, le=100)
    stop_token: str = Field(default="<<<END>>>", min_length=1)
    stop_on_criteria_pass: bool = False
    max_total_tokens: int | None = Field(default=None, gt=0)
    n_trials: int = Field(default=1, ge=1, le=1)
    check_criteria: Literal["end_of_dialog", "every_turn", "both"] = "end_of_dialog"
    answerer: str | None = None
    answers: list[str] = Field(default_factory=list)

    @field_validator("n_trials", mode="before")
    @classmethod
    def _n_trials(cls, v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool) and v > 1:
            raise ValueError(
                "n_trials > 1 repeats the conversation: in evalsite set the experiment's (or the "
                "variant's) repeats instead, each repeat is one conversation"
            )
        return v

    @field_validator("answerer")
    @classmethod
    def _answerer(cls, v: str | None) -> str | None:
        if v is not None and v not in known_answerers():
            raise ValueError(
                f"unknown answerer {v!r}; expected one of: {', '.join(known_answerers())} (packages add "
                f"answerers through the {ANSWERER_ENTRY_POINT_GROUP!r} entry-point group)"
            )
        return v

    @property
    def answerer_name(self) -> str:
        return self.answerer or ("scripted" if self.answers else "persona")


class ReferenceSpec(SpecModel):
    """A folder holding a correct solution; never shown to the agent. The `oracle` agent copies it
    over the workspace; with `script` (evalsite: Harbor's solution/solve.sh), a container task's
    oracle instead finds the folder at /solution and runs `bash /solution/<script>` in the working
    directory, with `env`."""

    directory: str
    # evalsite: a file of the folder the oracle runs (container tasks only).
    script: str | None = None
    # evalsite: variables for the script (Harbor's [solution].env).
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("script")
    @classmethod
    def _script(cls, v: str | None) -> str | None:
        return v if v is None else check_workspace_path(v, "script (a file of the reference folder)")

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return check_env(v, "env")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, str):  # evalsite: `reference: ref` means `reference: {directory: ref}`
            return {"directory": data}
        if isinstance(data, dict) and ("code" in data or "file" in data):
            raise ValueError(
                "reference.code / reference.file were removed in coder-eval: a reference is a folder, "
                "write `reference: {directory: <folder>}`"
            )
        return data


class DatasetSpec(SpecModel):
    """Fans a task out into one trial per row (inline `rows` or JSONL `paths`)."""

    paths: list[str] | None = None
    rows: list[dict[str, Any]] | None = None
    id_field: str = "id"
    stratify_field: str = "expected_skill"
    sample_per_stratum: int | None = Field(default=None, ge=1)
    sample_seed: int | None = None

    @model_validator(mode="after")
    def _one_source(self) -> DatasetSpec:
        if self.paths is None and self.rows is None:
            raise SpecError(((), "set either rows (inline) or paths (JSONL files)"))
        if self.paths is not None and self.rows is not None:
            raise SpecError((("paths",), "set either rows or paths, not both"))
        if self.paths is not None and not self.paths:
            raise SpecError((("paths",), "must list at least one JSONL file"))
        return self


# --- prompt mutations --------------------------------------------------------------------


class PromptPrefix(SpecModel):
    type: Literal["prefix"]
    content: str
    separator: str = "\n\n"


class PromptSuffix(SpecModel):
    type: Literal["suffix"]
    content: str
    separator: str = "\n\n"


class PromptReplace(SpecModel):
    type: Literal["replace"]
    pattern: str
    replacement: str
    regex: bool = False

    @model_validator(mode="after")
    def _regex(self) -> PromptReplace:
        if self.regex:
            try:
                check_regex(self.pattern)
            except ValueError as exc:
                raise SpecError((("pattern",), str(exc))) from None
        return self


class PromptTemplate(SpecModel):
    type: Literal["template"]
    variables: dict[str, str]


PromptMutation = Annotated[
    PromptPrefix | PromptSuffix | PromptReplace | PromptTemplate, Field(discriminator="type")
]


def _kebab_tags(tags: list[str]) -> list[str]:
    for tag in tags:
        if not TAG_RE.match(tag):
            raise ValueError(
                f"tag {tag!r} must be lowercase kebab-case, optionally 'key:value' "
                "(e.g. 'smoke', 'lang:python')"
            )
    return tags


def _slug(value: str, what: str) -> str:
    if not SLUG_RE.match(value) or len(value) > 200:
        raise ValueError(f"{what} {value!r} must be a slug: letters, digits, '-' and '_' (at most 200)")
    return value


# --- task --------------------------------------------------------------------------------


class TaskSpec(SpecModel):
    """One coder-eval task."""

    task_id: str
    description: str = ""
    initial_prompt: str | None = None
    initial_prompt_file: str | None = None
    tags: list[str] = Field(default_factory=list)
    skip: bool = False
    agent: AgentSpec | None = None
    sandbox: SandboxSpec = Field(default_factory=SandboxSpec)
    success_criteria: list[Criterion]
    run_limits: RunLimits | None = None
    pre_run: list[PreRunCommand] = Field(default_factory=list)
    post_run: list[PostRunCommand] = Field(default_factory=list)
    hooks: HooksSpec | None = None
    integrity: IntegritySpec | None = None
    budgets: Budgets | None = None
    reference: ReferenceSpec | None = None
    dataset: DatasetSpec | None = None
    simulation: SimulationSpec | None = None
    expected_commands: int | None = Field(default=None, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _refuse_unbuilt(cls, data: Any) -> Any:
        return refuse_unbuilt(data)

    @field_validator("task_id")
    @classmethod
    def _task_id(cls, v: str) -> str:
        if not TASK_ID_RE.match(v) or len(v) > 200:
            raise ValueError(
                f"task_id {v!r} must be a slug: letters, digits, '-', '_', single inner dots (at most 200)"
            )
        return v

    @field_validator("tags")
    @classmethod
    def _tags(cls, v: list[str]) -> list[str]:
        return _kebab_tags(v)

    @field_validator("success_criteria")
    @classmethod
    def _some_criteria(cls, v: list[Any]) -> list[Any]:
        if not v:
            raise ValueError("at least one success criterion is required")
        return v

    @property
    def is_agentless(self) -> bool:
        return self.agent is not None and self.agent.type in AGENTLESS_KINDS

    @model_validator(mode="after")
    def _cross_checks(self, info: ValidationInfo) -> TaskSpec:
        # A resolved trial config may switch a task to an agentless kind (an A/B arm such as
        # `none` or `oracle`): the task keeps its prompt and agent criteria, which then fail.
        resolved = bool(info.context and info.context.get("resolved"))
        issues = [
            *_prompt_issues(self, resolved),
            *_criteria_issues(self, resolved),
            *_early_stop_issues(self),
            *_simulation_issues(self),
            *_suite_hook_issues(self, resolved),
            *_container_issues(self),
        ]
        if issues:
            raise SpecError(*issues)
        return self


def _prompt_issues(task: TaskSpec, resolved: bool = False) -> list[tuple[tuple[str | int, ...], str]]:
    """coder-eval: exactly one prompt source, except for `type: none` agents and simulations."""
    has_prompt = task.initial_prompt is not None or task.initial_prompt_file is not None
    if task.initial_prompt is not None and task.initial_prompt_file is not None:
        return [(("initial_prompt_file",), "set either initial_prompt or initial_prompt_file, not both")]
    if task.is_agentless and has_prompt and not resolved:
        field = "initial_prompt" if task.initial_prompt is not None else "initial_prompt_file"
        return [((field,), "an agent of type none reads no prompt: remove it or pick another agent type")]
    simulated = task.simulation is not None and task.simulation.enabled
    if not has_prompt and not task.is_agentless and not simulated:
        return [
            (
                ("initial_prompt",),
                "required: set initial_prompt or initial_prompt_file (only `agent: {type: none}` needs none)",
            )
        ]
    return []


def _simulation_issues(task: TaskSpec) -> list[tuple[tuple[str | int, ...], str]]:
    """What a conversation needs: an agent that can resume, someone to answer, no early stop."""
    sim = task.simulation
    if sim is None or not sim.enabled:
        return []
    issues: list[tuple[tuple[str | int, ...], str]] = []
    kind = task.agent.type if task.agent is not None and task.agent.type else agent_kinds.DEFAULT_KIND
    if kind in agent_kinds.BUILTIN_KINDS and kind not in RESUMABLE_KINDS:
        issues.append(
            (
                ("agent", "type"),
                f"a simulation answers the agent turn after turn, and agent type {kind} cannot resume "
                f"its session: use one of {', '.join(RESUMABLE_KINDS)}, or switch the simulation off "
                "(simulation.enabled: false)",
            )
        )
    if sim.answerer_name == "persona":
        for key in ("persona", "goal"):
            if not (getattr(sim, key) or "").strip():
                issues.append(
                    (
                        ("simulation", key),
                        f"required by the persona answerer: describe the simulated user's {key}, or "
                        "give `answers:` for the scripted answerer",
                    )
                )
    elif sim.answerer_name == "scripted" and not sim.answers:
        issues.append((("simulation", "answers"), "the scripted answerer needs at least one answer"))
    if sim.answers and sim.answerer_name != "scripted":
        issues.append(
            (("simulation", "answers"), f"only the scripted answerer reads answers, not {sim.answerer_name}")
        )
    if sim.stop_on_criteria_pass and sim.check_criteria == "end_of_dialog":
        issues.append(
            (
                ("simulation", "stop_on_criteria_pass"),
                "needs the criteria checked during the conversation: set check_criteria to "
                "every_turn or both",
            )
        )
    limits = task.run_limits
    armed = any(getattr(c, "stop_early", None) is not None for c in task.success_criteria)
    if armed and not (limits is not None and limits.stop_early is False):
        issues.append(
            (
                ("simulation",),
                "a stop_early criterion cannot watch a conversation (coder-eval refuses the pair too): "
                "disarm it (run_limits.stop_early: false) or switch the simulation off",
            )
        )
    return issues


def _suite_hook_issues(task: TaskSpec, resolved: bool) -> list[tuple[tuple[str | int, ...], str]]:
    # A resolved config carries the experiment's suite hooks (they are part of what a trial ran).
    if resolved or task.hooks is None or task.hooks.suite is None:
        return []
    return [
        (
            ("hooks", "suite"),
            "hooks.suite runs once per run, for every task: set it in the experiment's defaults, "
            "not in a task (hooks.trial runs around each trial)",
        )
    ]


def _container_issues(task: TaskSpec) -> list[tuple[tuple[str | int, ...], str]]:
    """What `driver: docker` needs, and what only a container task may ask for. Checked on a task
    and on a resolved config, not on a layer: an experiment may set the driver or the image for
    tasks that set the other."""
    box = task.sandbox
    issues: list[tuple[tuple[str | int, ...], str]] = []
    if box.driver != "docker":
        for i, crit in enumerate(task.success_criteria):
            if crit.graded_in == "container":
                issues.append(
                    (
                        ("success_criteria", i, "type"),
                        f"a {crit.type} criterion runs inside the task's container: set sandbox.driver: "
                        "docker (with docker.image or docker.dockerfile_path)",
                    )
                )
        if task.reference is not None and task.reference.script is not None:
            issues.append(
                (
                    ("reference", "script"),
                    "the oracle runs reference.script inside the task's container: set sandbox.driver: "
                    "docker, or remove script (the oracle then copies the folder)",
                )
            )
        return issues
    docker = box.docker
    if docker.image is None and docker.dockerfile_path is None:
        unknown = ", ".join(map(repr, docker.model_extra or {}))
        issues.append(
            (
                ("sandbox", "driver"),
                "driver: docker needs docker.image (an image every worker holds) or "
                "docker.dockerfile_path (a Dockerfile beside the task): coder-eval's default image "
                "coder-eval-agent:<version> is built from coder-eval's source and no worker has it "
                "(docs/coder-eval.md says what to use instead)"
                + (f"; sandbox.docker holds unknown keys: {unknown}" if unknown else ""),
            )
        )
    if docker.network == "bridge" and box.network != "bridge":
        issues.append(
            (
                ("sandbox", "docker", "network"),
                "docker.network: bridge is open internet in coder-eval, and evalsite gives none: list the "
                "hosts the task needs in sandbox.allowed_hosts with sandbox.network: bridge (reached "
                "through the gateway), or set docker.network: none",
            )
        )
    if docker.network == "none" and box.network == "bridge":
        issues.append(
            (("sandbox", "docker", "network"), "docker.network: none disagrees with sandbox.network: bridge")
        )
    for env in ("python", "node"):
        packages = getattr(box, env)
        if packages is not None and packages.env_packages:
            issues.append(
                (
                    ("sandbox", env, "env_packages"),
                    "a container has no network to install packages from, and the worker's own "
                    "environments do not fit another image: install them in the Dockerfile (RUN pip "
                    "install ..., RUN npm install -g ...)",
                )
            )
    return issues


def _early_stop_issues(task: TaskSpec) -> list[tuple[tuple[str | int, ...], str]]:
    """coder-eval's resolution checks of early stop (`orchestration/early_stop.py`)."""
    limits = task.run_limits
    if limits is not None and limits.stop_early is True:
        return [
            (
                ("run_limits", "stop_early"),
                "run_limits.stop_early: true was removed in coder-eval: arming is per criterion; put "
                "a stop_early: block ({}, {on_pass: stop} or {decide_within: N}) on a command_executed "
                "criterion (run_limits.stop_early: false disarms them all)",
            )
        ]
    armed = any(getattr(c, "stop_early", None) is not None for c in task.success_criteria)
    if not armed or (limits is not None and limits.stop_early is False):
        return []
    if limits is not None and limits.stop_early_gate_threshold <= 0.0:
        return [
            (
                ("run_limits", "stop_early_gate_threshold"),
                f"must be > 0 on a task with an armed criterion (got {limits.stop_early_gate_threshold}): "
                "a threshold of 0 passes the armed gate whatever the criteria decided",
            )
        ]
    if task.agent is not None and task.agent.type in agent_kinds.UNWATCHED_KINDS:
        return [
            (
                ("agent", "type"),
                f"a stop_early criterion watches the agent's tool calls, and agent type {task.agent.type} "
                "makes none: disarm with run_limits.stop_early: false, or pick another agent type",
            )
        ]
    return []


def _criteria_issues(task: TaskSpec, resolved: bool = False) -> list[tuple[tuple[str | int, ...], str]]:
    issues: list[tuple[tuple[str | int, ...], str]] = []
    for i, crit in enumerate(task.success_criteria):
        if task.is_agentless and crit.requires_agent and not resolved:
            issues.append(
                (("success_criteria", i, "type"), f"{crit.type} needs an agent, but agent.type is none")
            )
        if crit.suite_thresholds and task.dataset is None:
            issues.append((("success_criteria", i, "suite_thresholds"), "requires a dataset: block"))
        if crit.type == "reference_comparison" and task.reference is None:
            issues.append(
                (
                    ("success_criteria", i, "reference_file"),
                    "reference_comparison compares with the task's reference folder, and the task has no "
                    "reference: block",
                )
            )
        uses_reference = any(_path_uses_reference(f) for f in getattr(crit, "files", []))
        uses_reference |= _command_uses_reference(getattr(crit, "command", "") or "")
        if uses_reference and task.reference is None:
            issues.append(
                (
                    ("success_criteria", i),
                    "uses $REFERENCE_DIR but the task has no reference: folder; add "
                    "`reference: {directory: <folder>}`",
                )
            )
    return issues


def _path_uses_reference(path: str) -> bool:
    """A files entry naming the reference folder: the bare token, or the token and a separator
    (`$REFERENCE_DIRECTORY/x` is a workspace path), as coder-eval's `path_uses_token` reads it."""
    rest = path.removeprefix(REFERENCE_DIR_TOKEN)
    return rest != path and (rest == "" or rest[0] in "/\\")


def _command_uses_reference(command: str) -> bool:
    """A command using the variable, `$REFERENCE_DIR` or `${REFERENCE_DIR}` (not
    `$REFERENCE_DIRECTORY`), as coder-eval's `command_uses_token` reads it."""
    return bool(re.search(r"\$\{REFERENCE_DIR\}|\$REFERENCE_DIR(?![A-Za-z0-9_])", command))
