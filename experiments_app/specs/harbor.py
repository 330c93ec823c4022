"""Harbor task folders read as evalsite tasks (no Django).

A Harbor task is a folder (docs/harbor.md):

    task.toml           [task], [metadata], [agent], [verifier], [environment], [solution]
    instruction.md      the agent's prompt
    environment/        Dockerfile and its build context (or [environment].docker_image)
    tests/test.sh       the verifier: writes /logs/verifier/reward.txt or reward.json
    solution/solve.sh   the reference solution (optional; what the `oracle` agent runs)

`read_task_toml` parses task.toml with Python's `tomllib`, which keeps no positions, and finds
each key's line in the text itself (`key_lines`: table headers, `key =` lines, dotted and quoted
keys, one-line inline tables; multi-line strings and arrays skipped). `harbor_task` checks the
folder and turns it into the data of a coder-eval task, the dict a task YAML would hold, plus
where each field came from in task.toml (`origins`), so that every error, the task model's
included, names the TOML key and its line. A key Harbor defines that evalsite cannot run as
Harbor does is refused by name, with what to do instead.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from experiments_app.specs.agent_kinds import PREAMBLE_OPTION
from experiments_app.specs.base import SpecError, SpecModel
from experiments_app.specs.docker import check_env, check_user
from experiments_app.specs.task import TASK_ID_RE
from experiments_app.specs.yaml_errors import Loc, Root, SpecIssue, field_name, inside, unknown_key_problems

TASK_FILE = "task.toml"
INSTRUCTION = "instruction.md"
DOCKERFILE = "environment/Dockerfile"
COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")
TESTS_DIR, TEST_SCRIPT = "tests", "test.sh"
SOLUTION_DIR, SOLVE_SCRIPT = "solution", "solve.sh"
# Harbor's resource defaults (`EnvironmentConfig`): a task that names none runs with these.
DEFAULT_CPUS, DEFAULT_MEMORY_MB, DEFAULT_STORAGE_MB = 1, 2048, 10240
MAX_TOML_BYTES = 1024 * 1024

_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([GMK])\s*$", re.IGNORECASE)
_AT_LINE = re.compile(r"\s*\(at line (\d+), column (\d+)\)")
_TEMPLATE = re.compile(r"\$\{")


# --- task.toml and its lines ---------------------------------------------------------------------


@dataclass
class TomlDoc:
    """A parsed task.toml: its data, and the line of every key found in its text."""

    shown: str
    abs: str
    root: Root
    text: str
    data: dict[str, Any]
    lines: dict[tuple[str, ...], int]

    @property
    def folder(self) -> str:
        return os.path.dirname(self.abs)

    def line_of(self, loc: Loc) -> int | None:
        """The line of `loc`'s key, else of its nearest ancestor's (a table header)."""
        keys = tuple(str(part) for part in loc if not isinstance(part, int))
        while keys:
            if keys in self.lines:
                return self.lines[keys]
            keys = keys[:-1]
        return None

    def issue(self, loc: Loc, message: str, severity: str = "error") -> SpecIssue:
        return SpecIssue(self.shown, self.line_of(loc), field_name(loc), message, severity)  # type: ignore[arg-type]


def read_task_toml(path: Path, root: Root) -> tuple[TomlDoc | None, SpecIssue | None]:
    abs_path = os.path.abspath(path)
    shown = root.shown(abs_path) if inside(root.abs, abs_path) else str(path)
    if not inside(root.real, os.path.realpath(path)):
        return None, SpecIssue(shown, None, "", "is a symlink whose target leaves the folder being imported")
    try:
        if path.stat().st_size > MAX_TOML_BYTES:
            return None, SpecIssue(shown, None, "", f"is larger than {MAX_TOML_BYTES} bytes")
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return None, SpecIssue(shown, None, "", f"cannot read the file: {exc}")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        found = _AT_LINE.search(str(exc))
        detail = _AT_LINE.sub("", str(exc))
        if found:
            return None, SpecIssue(shown, int(found[1]), "", f"invalid TOML: {detail} (column {found[2]})")
        return None, SpecIssue(shown, None, "", f"invalid TOML: {detail}")
    return TomlDoc(shown, abs_path, root, text, data, key_lines(text)), None


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _key_at(text: str, i: int) -> tuple[tuple[str, ...], int] | None:
    """The (dotted) key starting at text[i], and where it ends; None when none starts there."""
    parts: list[str] = []
    while True:
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] in "\"'":
            quote, j = text[i], i + 1
            while j < len(text) and text[j] != quote:
                j += 2 if quote == '"' and text[j] == "\\" else 1
            if j >= len(text):
                return None
            parts.append(text[i + 1 : j])
            i = j + 1
        else:
            bare = _BARE_KEY.match(text, i)
            if bare is None:
                return None
            parts.append(bare.group())
            i = bare.end()
        while i < len(text) and text[i] in " \t":
            i += 1
        if i >= len(text) or text[i] != ".":
            return tuple(parts), i
        i += 1


def _scan(text: str, i: int, depth: int, key: tuple[str, ...], n: int, lines: dict) -> tuple[int, str | None]:
    """Read a value from text[i]: follow brackets, strings and comments, and record the keys of
    inline tables (TOML keeps each on one line). Returns the depth of the arrays left open and the
    delimiter of a multi-line string left open."""
    stack: list[tuple[str, tuple[str, ...]]] = []  # open brackets, with the key each belongs to
    current, expect_key = key, False
    while i < len(text):
        if expect_key:
            expect_key = False
            found = _key_at(text, i)
            if found and text[found[1] : found[1] + 1] == "=":
                current = stack[-1][1] + found[0]
                lines.setdefault(current, n)
                i = found[1] + 1
                continue
        ch = text[i]
        if text.startswith(('"""', "'''"), i):
            end = text.find(text[i : i + 3], i + 3)
            if end < 0:
                return depth + sum(1 for kind, _ in stack if kind == "["), text[i : i + 3]
            i = end + 3
            continue
        if ch in "\"'":
            j = i + 1
            while j < len(text) and text[j] != ch:
                j += 2 if ch == '"' and text[j] == "\\" else 1
            i = j + 1
            continue
        if ch == "#":
            break
        if ch in "{[":
            stack.append((ch, current))
            expect_key = ch == "{"
        elif ch in "}]":
            if stack:
                current = stack.pop()[1]
            else:
                depth = max(depth - 1, 0)
        elif ch == "," and stack and stack[-1][0] == "{":
            expect_key = True
        i += 1
    return depth + sum(1 for kind, _ in stack if kind == "["), None


def key_lines(text: str) -> dict[tuple[str, ...], int]:
    """The line of each key (and table header) of a TOML text, by its full path."""
    lines: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    depth, open_string = 0, None
    for n, line in enumerate(text.splitlines(), start=1):
        if open_string is not None:
            end = line.find(open_string)
            if end < 0:
                continue
            depth, open_string = _scan(line, end + 3, depth, table, n, lines)
            continue
        if depth:
            depth, open_string = _scan(line, 0, depth, table, n, lines)
            continue
        stripped = line.lstrip()
        if stripped.startswith("["):
            opening = 2 if stripped.startswith("[[") else 1
            found = _key_at(stripped, opening)
            if found:
                table = found[0]
                lines.setdefault(table, n)
            continue
        found = _key_at(line, 0)
        if found and found[1] < len(line) and line[found[1]] == "=":
            key = table + found[0]
            lines.setdefault(key, n)
            depth, open_string = _scan(line, found[1] + 1, 0, key, n, lines)
    return lines


# --- task.toml's model ---------------------------------------------------------------------------


class _Table(SpecModel):
    """A task.toml table: unknown keys are kept, and reported as errors (or warnings, lenient)."""


class HarborTaskInfo(_Table):
    name: str | None = None
    description: str = ""
    authors: list[Any] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)


class HarborAgent(_Table):
    timeout_sec: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    user: str | int | None = None
    # The time Harbor gives an agent to install itself in the container: evalsite installs none
    # (the agent CLIs are the worker's, mounted), so there is nothing to time.
    setup_timeout_sec: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    # Refused when set (`REFUSED`): kept as fields so that an empty value is not an unknown key.
    network_mode: Any = None
    allowed_hosts: list[Any] = Field(default_factory=list)

    @field_validator("user")
    @classmethod
    def _user(cls, v: str | int | None) -> str | int | None:
        return check_user(v, "user")


class HarborVerifier(_Table):
    timeout_sec: float = Field(default=600.0, gt=0, allow_inf_nan=False)
    env: dict[str, str] = Field(default_factory=dict)
    user: str | int | None = None
    environment_mode: Literal["shared"] | None = None
    network_mode: Any = None
    allowed_hosts: list[Any] = Field(default_factory=list)
    import_path: Any = None

    @field_validator("user")
    @classmethod
    def _user(cls, v: str | int | None) -> str | int | None:
        return check_user(v, "user")

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return check_env(v, "env")


class HarborEnvironment(_Table):
    build_timeout_sec: float = Field(default=600.0, gt=0, allow_inf_nan=False)
    docker_image: str | None = None
    cpus: float = Field(default=DEFAULT_CPUS, gt=0, le=1024, allow_inf_nan=False)
    memory_mb: int = Field(default=DEFAULT_MEMORY_MB, gt=0)
    storage_mb: int = Field(default=DEFAULT_STORAGE_MB, gt=0)
    # Harbor's older spellings ("2G", "512M"), which win over memory_mb / storage_mb as in Harbor.
    memory: str | None = None
    storage: str | None = None
    allow_internet: bool = True
    network_mode: Literal["no-network", "allowlist", "public"] | None = None
    allowed_hosts: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    os: Literal["linux", "windows"] | None = None
    gpus: int = Field(default=0, ge=0)
    gpu_types: list[Any] | None = None
    tpus: Any = None
    mcp_servers: list[Any] = Field(default_factory=list)
    skills_dir: Any = None
    healthcheck: Any = None

    @model_validator(mode="after")
    def _hosts_need_an_allowlist(self) -> HarborEnvironment:
        # Harbor's rule: hosts alone mean an allowlist; beside another mode they are an error.
        if self.allowed_hosts and self.network_mode not in (None, "allowlist"):
            raise SpecError(
                (
                    ("allowed_hosts",),
                    f'allowed_hosts needs network_mode = "allowlist", not {self.network_mode!r}',
                )
            )
        return self

    @property
    def allowlist(self) -> bool:
        """Whether the task names the hosts it reaches (Harbor's "allowlist" network)."""
        return self.network_mode == "allowlist" or (self.network_mode is None and bool(self.allowed_hosts))

    @field_validator("memory", "storage")
    @classmethod
    def _size(cls, v: str | None) -> str | None:
        if v is not None and not _SIZE.match(v):
            raise ValueError(f"{v!r} is not a size like '2G', '512M' or '1024K'")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return check_env(v, "env")


class HarborSolution(_Table):
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return check_env(v, "env")


class HarborTaskToml(_Table):
    """Harbor's task.toml (`harbor.models.task.config.TaskConfig`)."""

    version: str | None = None
    schema_version: str | None = None
    task: HarborTaskInfo | None = None
    # Arbitrary by Harbor's definition; description, tags, category and difficulty are read.
    metadata: dict[str, Any] = Field(default_factory=dict)
    agent: HarborAgent = Field(default_factory=HarborAgent)
    verifier: HarborVerifier = Field(default_factory=HarborVerifier)
    environment: HarborEnvironment = Field(default_factory=HarborEnvironment)
    solution: HarborSolution = Field(default_factory=HarborSolution)
    source: str | None = None
    artifacts: list[Any] = Field(default_factory=list)
    steps: list[Any] = Field(default_factory=list)
    multi_step_reward_strategy: Any = None


def _given(value: Any) -> bool:
    return not (value is None or value is False or value in ([], {}, ""))


_ONE_NETWORK = (
    "a network of its own for one phase: evalsite gives the whole trial one network, [environment]'s "
    '(network_mode = "allowlist" with allowed_hosts): move it there'
)
_ONE_STEP = "multi-step tasks: evalsite runs one instruction and one verifier per task: make each step a task"

# (path, when the value is refused, why and what to do instead)
REFUSED: list[tuple[tuple[str, ...], Any, str]] = [
    (("steps",), _given, _ONE_STEP),
    (("multi_step_reward_strategy",), _given, _ONE_STEP),
    (
        ("artifacts",),
        _given,
        "paths Harbor copies out of the container after a trial: evalsite keeps the working directory "
        "(its workspace) only: have the agent or tests/test.sh write what you need there",
    ),
    (("agent", "network_mode"), _given, _ONE_NETWORK),
    (("agent", "allowed_hosts"), _given, _ONE_NETWORK),
    (("verifier", "network_mode"), _given, _ONE_NETWORK),
    (("verifier", "allowed_hosts"), _given, _ONE_NETWORK),
    (
        ("verifier", "import_path"),
        _given,
        "a verifier class Harbor runs on its own host: evalsite runs tests/test.sh in the container, "
        "nothing of a task on the worker: write the check as tests/test.sh",
    ),
    (
        ("verifier", "environment_mode"),
        lambda v: v not in (None, "shared"),
        "a separate verifier container: evalsite runs the verifier in the agent's container (Harbor's "
        '"shared" mode): remove it',
    ),
    (
        ("environment", "network_mode"),
        lambda v: v == "public",
        "open internet: evalsite's sandboxes reach only the hosts a task names, through the gateway: set "
        'network_mode = "allowlist" with allowed_hosts = ["pypi.org", ...], or "no-network"',
    ),
    (
        ("environment", "os"),
        lambda v: v not in (None, "linux"),
        "a Windows container: evalsite's workers run Linux containers only",
    ),
    (
        ("environment", "gpus"),
        lambda v: v not in (None, 0),
        "GPUs: evalsite's workers give containers none: remove it (or gpus = 0)",
    ),
    (("environment", "gpu_types"), _given, "GPU types: evalsite's workers give containers no GPU: remove it"),
    (("environment", "tpus"), lambda v: v not in (None, 0), "TPUs: evalsite's workers give containers none"),
    (
        ("environment", "mcp_servers"),
        _given,
        "MCP servers for the agent: evalsite starts none, and the container reaches no server but the "
        "model's gateway: remove them",
    ),
    (
        ("environment", "skills_dir"),
        _given,
        "a skills folder copied into the agent's configuration: evalsite installs no skills: remove it",
    ),
    (
        ("environment", "healthcheck"),
        _given,
        "a readiness check before the agent starts: evalsite has no such step: remove it",
    ),
]


def _get(data: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def _refusals(doc: TomlDoc) -> list[SpecIssue]:
    issues = []
    for path, refused, why in REFUSED:
        value = _get(doc.data, path)
        if value is not None and refused(value):
            issues.append(doc.issue(path, f"Harbor's {'.'.join(path)} ({why}) is refused"))
    environment = doc.data.get("environment")
    if (
        isinstance(environment, dict)
        and environment.get("allow_internet") is True
        and environment.get("network_mode") is None
        and not environment.get("allowed_hosts")  # hosts alone make an allowlist, which wins
    ):
        issues.append(
            doc.issue(
                ("environment", "allow_internet"),
                "allow_internet = true gives the container open internet, and evalsite's sandboxes reach "
                "only the hosts a task names, through the gateway: set allow_internet = false, or "
                'network_mode = "allowlist" with allowed_hosts = ["pypi.org", ...]',
            )
        )
    for table in ("environment", "verifier", "solution"):
        env = _get(doc.data, (table, "env"))
        for name, value in (env or {}).items() if isinstance(env, dict) else ():
            if isinstance(value, str) and _TEMPLATE.search(value):
                issues.append(
                    doc.issue(
                        (table, "env", name),
                        f"{value!r} takes a value from the host's environment (Harbor's ${{VAR}}), and "
                        "evalsite passes no variable of the worker into a container (the model's key "
                        "comes from the gateway): write the value itself",
                    )
                )
    return issues


def _strip(data: dict[str, Any]) -> dict[str, Any]:
    """`data` without the refused keys (reported already), so the model reports the rest."""
    data = {key: dict(value) if isinstance(value, dict) else value for key, value in data.items()}
    for path, refused, _ in REFUSED:
        value = _get(data, path)
        if value is not None and refused(value):
            parent = _get(data, path[:-1]) if len(path) > 1 else data
            if isinstance(parent, dict):
                parent.pop(path[-1], None)
    return data


# --- the folder ----------------------------------------------------------------------------------


@dataclass
class HarborTask:
    """What `harbor_task` makes of a folder: the task's data, or the problems."""

    data: dict[str, Any] | None = None
    # Task field path -> the task.toml key it came from (for the task model's errors).
    origins: dict[Loc, Loc] = field(default_factory=dict)
    errors: list[SpecIssue] = field(default_factory=list)
    warnings: list[SpecIssue] = field(default_factory=list)


def _layout_issues(doc: TomlDoc, config: dict[str, Any]) -> list[SpecIssue]:
    """The files a Harbor task needs, and the layouts evalsite cannot run."""
    folder, root = doc.folder, doc.root

    def missing(relative: str, what: str) -> SpecIssue:
        return SpecIssue(root.shown(os.path.join(folder, relative)), None, "", f"not found: {what}")

    issues = []
    if not os.path.isfile(os.path.join(folder, INSTRUCTION)):
        issues.append(missing(INSTRUCTION, "a Harbor task's prompt is instruction.md, beside task.toml"))
    if not os.path.isfile(os.path.join(folder, TESTS_DIR, TEST_SCRIPT)):
        issues.append(
            missing(
                f"{TESTS_DIR}/{TEST_SCRIPT}",
                "a Harbor task's verifier is tests/test.sh (it writes /logs/verifier/reward.txt or "
                "reward.json)",
            )
        )
    image = _get(config, ("environment", "docker_image"))
    if not image and not os.path.isfile(os.path.join(folder, DOCKERFILE)):
        issues.append(
            missing(DOCKERFILE, "a Harbor task's container is built from environment/Dockerfile, or named by "
                    "[environment].docker_image")
        )  # fmt: skip
    for name in COMPOSE_FILES:
        if os.path.isfile(os.path.join(folder, "environment", name)):
            issues.append(
                SpecIssue(
                    root.shown(os.path.join(folder, "environment", name)),
                    None,
                    "",
                    "a compose file asks for several containers (services) or host mounts, and evalsite "
                    "runs one container per trial from environment/Dockerfile: fold what the task needs "
                    "into the Dockerfile and remove this file",
                )
            )
    if os.path.isdir(os.path.join(folder, "steps")):
        issues.append(SpecIssue(root.shown(os.path.join(folder, "steps")), None, "", _ONE_STEP))
    solution = os.path.join(folder, SOLUTION_DIR)
    if os.path.isdir(solution) and not os.path.isfile(os.path.join(solution, SOLVE_SCRIPT)):
        issues.append(
            missing(
                f"{SOLUTION_DIR}/{SOLVE_SCRIPT}",
                "the oracle runs solution/solve.sh: add it, or remove the solution folder",
            )
        )
    return issues


def harbor_task(doc: TomlDoc, *, lenient: bool = False) -> HarborTask:
    """The task a Harbor folder describes, as the data of a coder-eval task (validate it with
    `TaskSpec`; map its errors back with `spec_issues`). Every problem of task.toml and of the
    folder's layout is reported at once."""
    result = HarborTask()
    result.errors += _refusals(doc)
    result.errors += _layout_issues(doc, doc.data)
    try:
        config = HarborTaskToml.model_validate(_strip(doc.data))
    except ValidationError as exc:
        result.errors += toml_issues(doc, exc)
        return result
    for loc, message in unknown_key_problems(config):
        if lenient:
            unknown, _, hint = message.partition(" (known here")[0].partition("; ")
            warning = f"{unknown}, kept but not used" + (f"; {hint}" if hint else "")
            result.warnings.append(doc.issue(loc, warning, "warning"))
        else:
            result.errors.append(doc.issue(loc, message.removesuffix(")") + "; --lenient warns instead)"))
    name = os.path.basename(doc.folder)
    if not TASK_ID_RE.match(name) or len(name) > 200:
        result.errors.append(
            SpecIssue(
                doc.shown,
                None,
                "",
                f"the folder's name {name!r} is the task's id, and must be letters, digits, '-', '_' and "
                "single inner dots (at most 200): rename the folder",
            )
        )
    if result.errors:
        return result
    result.data, result.origins = _task_data(name, config, doc)
    return result


def _tag(text: str) -> str:
    """A Harbor keyword as an evalsite tag: lowercase kebab-case ("File IO" -> "file-io")."""
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-")


def _tags(config: HarborTaskToml) -> tuple[list[str], Loc | None]:
    metadata = config.metadata
    words = list(config.task.keywords if config.task else [])
    raw = metadata.get("tags")
    words += [str(t) for t in raw] if isinstance(raw, list) else []
    tags = [_tag(word) for word in words]
    for key in ("category", "difficulty"):
        value = metadata.get(key)
        if isinstance(value, str) and _tag(value):
            tags.append(f"{key}:{_tag(value)}")
    origin: Loc | None = ("task", "keywords") if config.task and config.task.keywords else ("metadata",)
    return list(dict.fromkeys(tag for tag in tags if tag)), origin


def _size_mb(text: str) -> int:
    """Harbor's `_parse_size_to_mb`: "2G" -> 2048, "512M" -> 512, "1024K" -> 1."""
    found = _SIZE.match(text)
    assert found is not None  # checked by the model
    number, unit = float(found[1]), found[2].upper()
    return int(number * 1024) if unit == "G" else int(number) if unit == "M" else int(number / 1024)


def _task_data(name: str, config: HarborTaskToml, doc: TomlDoc) -> tuple[dict[str, Any], dict[Loc, Loc]]:
    """The coder-eval task data of a valid Harbor folder, and each field's task.toml key."""
    folder = doc.folder
    env, agent, verifier = config.environment, config.agent, config.verifier
    origins: dict[Loc, Loc] = {}

    def put(target: dict, path: Loc, value: Any, origin: Loc) -> None:
        node: Any = target
        for key in path[:-1]:
            node = node[key] if isinstance(key, int) else node.setdefault(key, {})
        node[path[-1]] = value
        origins[path] = origin

    data: dict[str, Any] = {"task_id": name}
    description = config.task.description if config.task else ""
    if description:
        put(data, ("description",), description, ("task", "description"))
    elif isinstance(config.metadata.get("description"), str):
        put(data, ("description",), config.metadata["description"], ("metadata", "description"))
    tags, tags_origin = _tags(config)
    if tags and tags_origin is not None:
        put(data, ("tags",), tags, tags_origin)
    data["initial_prompt_file"] = INSTRUCTION
    # Harbor sends the instruction as written; coder-eval's working-directory line is for its tasks.
    data["agent"] = {PREAMBLE_OPTION: False}
    if agent.timeout_sec is not None:
        put(data, ("run_limits", "task_timeout"), math.ceil(agent.timeout_sec), ("agent", "timeout_sec"))
        # Harbor's agent has one turn, graded when its clock ends: the turn's clock must not end
        # first (a turn past `turn_timeout`, 300 s by default, is an ungraded error).
        put(data, ("run_limits", "turn_timeout"), math.ceil(agent.timeout_sec), ("agent", "timeout_sec"))

    # The container: an image, or the Dockerfile with environment/ as its context.
    docker: dict[str, Any] = {}
    data["sandbox"] = {"driver": "docker", "python": None, "docker": docker}
    if env.docker_image:
        put(data, ("sandbox", "docker", "image"), env.docker_image, ("environment", "docker_image"))
    else:
        docker["dockerfile_path"] = DOCKERFILE
    if "build_timeout_sec" in env.model_fields_set:
        put(data, ("sandbox", "docker", "build_timeout"), math.ceil(env.build_timeout_sec),
            ("environment", "build_timeout_sec"))  # fmt: skip
    put(data, ("sandbox", "docker", "working_dir"), env.workdir or "auto", ("environment", "workdir"))
    if env.env:
        put(data, ("sandbox", "docker", "env"), dict(env.env), ("environment", "env"))
    if agent.user is not None:
        put(data, ("sandbox", "docker", "user"), agent.user, ("agent", "user"))
    memory = ("environment", "memory") if env.memory else ("environment", "memory_mb")
    storage = ("environment", "storage") if env.storage else ("environment", "storage_mb")
    limits = ("sandbox", "limits")
    put(data, (*limits, "max_cpus"), env.cpus, ("environment", "cpus"))
    put(data, (*limits, "max_memory_mb"), _size_mb(env.memory) if env.memory else env.memory_mb, memory)
    put(data, (*limits, "max_disk_mb"), _size_mb(env.storage) if env.storage else env.storage_mb, storage)
    # Network: none, unless the task lists hosts (reached through the gateway only). An allowlist
    # of no host reaches nothing, as in Harbor.
    if env.allowlist and env.allowed_hosts:
        put(data, ("sandbox", "network"), "bridge", ("environment", "network_mode"))
        put(data, ("sandbox", "allowed_hosts"), list(env.allowed_hosts), ("environment", "allowed_hosts"))
    else:
        put(data, ("sandbox", "network"), "none", ("environment", "allow_internet"))

    if os.path.isdir(os.path.join(folder, SOLUTION_DIR)):
        data["reference"] = {"directory": SOLUTION_DIR, "script": SOLVE_SCRIPT}
        if config.solution.env:
            put(data, ("reference", "env"), dict(config.solution.env), ("solution", "env"))

    criterion: dict[str, Any] = {
        "type": "verifier",
        "description": "tests/test.sh (Harbor's verifier)",
        "tests_dir": TESTS_DIR,
        "script": TEST_SCRIPT,
    }
    data["success_criteria"] = [criterion]
    check = ("success_criteria", 0)
    put(data, (*check, "timeout"), math.ceil(verifier.timeout_sec), ("verifier", "timeout_sec"))
    if verifier.env:
        put(data, (*check, "env"), dict(verifier.env), ("verifier", "env"))
    if verifier.user is not None:
        put(data, (*check, "user"), verifier.user, ("verifier", "user"))
    return data, origins


# --- errors --------------------------------------------------------------------------------------


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _messages(exc: ValidationError) -> list[tuple[Loc, str]]:
    """(location, message) of each error of a model, a SpecError's own locations spelled out."""
    found: list[tuple[Loc, str]] = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, SpecError):
            found += [((*loc, *sub), message) for sub, message in cause.issues]
        elif err["type"] == "missing":
            found.append((loc, "required field is missing"))
        elif err["type"] == "value_error":
            found.append((loc, str(cause if cause is not None else err["msg"])))
        else:
            message = err["msg"].replace("Input should be", "expected", 1)
            found.append((loc, f"{message}, got {_short(err.get('input'))}"))
    return found


def toml_issues(doc: TomlDoc, exc: ValidationError) -> list[SpecIssue]:
    """The errors of task.toml's model, at their keys' lines."""
    return [doc.issue(loc, message) for loc, message in _messages(exc)]


def spec_issues(doc: TomlDoc, exc: ValidationError, origins: dict[Loc, Loc]) -> list[SpecIssue]:
    """The task model's errors on a Harbor task's data, named by the task.toml key each field
    came from (a field of no key is named as the task's field, in task.toml)."""
    from experiments_app.specs.experiment import UNION_TAGS

    issues = []
    for loc, message in _messages(exc):
        loc = tuple(part for part in loc if part not in UNION_TAGS)
        for cut in range(len(loc), 0, -1):
            if loc[:cut] in origins:
                issues.append(doc.issue((*origins[loc[:cut]], *loc[cut:]), message))
                break
        else:
            issues.append(SpecIssue(doc.shown, None, field_name(loc), message))
    return issues
