"""Shared pieces of grading: the context a criterion sees, results, and parameter checks.

Nothing here imports Django; every helper is a small pure function.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, overload

# Per-stream budget for command output and file excerpts kept in details (coder-eval keeps 4000).
OUTPUT_BUDGET = 4000
# Files larger than this are read only up to it: a 1 GB file written by an agent must not
# fill the worker's memory.
MAX_FILE_BYTES = 16 * 1024 * 1024
# A value containing this is filled in per dataset row by the runner, so it can only be
# checked for its type before substitution, never compiled.
ROW_PLACEHOLDER = "${row."


class CriterionConfigError(ValueError):
    """A criterion's parameters are wrong: the task author must fix the YAML."""


@dataclass(frozen=True)
class CommandOutcome:
    """What the sandbox reports for one command it ran for a criterion."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False


@dataclass
class GradingContext:
    """Everything a criterion may read: the finished workspace and the recorded events.

    `tool_calls` are the agent's recorded tool calls, each `{"name": str, "input": dict}`,
    optionally with `"is_error": bool` (needed by `command_executed.require_success`).
    `run_command(command, timeout_seconds)` runs a shell command in the sandbox, with the
    workspace as its working directory, under the runner's process control.
    """

    workspace: Path
    tool_calls: list[dict] = field(default_factory=list)
    final_text: str = ""
    run_command: Callable[[str, float], CommandOutcome] | None = None
    dataset_row: dict | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    # The task bundle's folder ("$TASK_DIR/x" in llm_judge files) and the reference
    # solution's folder ("$REFERENCE_DIR/x", include_reference), when the runner has them.
    task_dir: Path | None = None
    reference_dir: Path | None = None
    # Folders a workspace link may lead into: the read-only environments of the task's
    # env_packages (`node_modules` links to one).
    shared_roots: tuple[Path, ...] = ()
    # A simulated conversation, in order: {"role": "task" | "user" | "agent", "text": ...}.
    dialog: list[dict] = field(default_factory=list)
    # How a criterion asks a model (llm_judge): the worker's judge gateway, which counts the call
    # as the judge's; `post_model(body, timeout)` returns the reply. None: straight to the API.
    post_model: Callable[[dict, float], dict] | None = None


@dataclass
class CriterionResult:
    """One criterion's verdict. `details` is JSON-serialisable; `error` means it crashed."""

    index: int
    type: str
    description: str
    score: float
    passed: bool
    weight: float
    pass_threshold: float
    gating: bool
    details: dict = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True)
class CriterionType:
    """A registered criterion: parameter check, evaluation and its default threshold."""

    name: str
    check_params: Callable[[dict], None]
    evaluate: Callable[[dict, GradingContext], tuple[float, dict]]
    default_pass_threshold: float = 0.9


# ---------------------------------------------------------------- parameter checks


def is_templated(value: Any) -> bool:
    return isinstance(value, str) and ROW_PLACEHOLDER in value


def allow_only(params: Mapping, type_name: str, allowed: set[str]) -> None:
    """Reject unknown keys, as coder-eval does (`extra="forbid"`): a typo must not pass silently."""
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise CriterionConfigError(
            f"{type_name}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}"
        )


def req_str(params: Mapping, key: str, type_name: str) -> str:
    value = params.get(key)
    if not isinstance(value, str) or not value:
        raise CriterionConfigError(f"{type_name}: '{key}' is required and must be a non-empty string")
    return value


def opt_str(params: Mapping, key: str, type_name: str) -> str | None:
    value = params.get(key)
    if value is not None and not isinstance(value, str):
        raise CriterionConfigError(f"{type_name}: '{key}' must be a string, got {type(value).__name__}")
    return value


def opt_bool(params: Mapping, key: str, type_name: str, default: bool) -> bool:
    value = params.get(key, default)
    if not isinstance(value, bool):
        raise CriterionConfigError(f"{type_name}: '{key}' must be true or false, got {value!r}")
    return value


@overload
def opt_int(params: Mapping, key: str, type_name: str, default: int, minimum: int = 0) -> int: ...


@overload
def opt_int(params: Mapping, key: str, type_name: str, default: None, minimum: int = 0) -> int | None: ...


def opt_int(params: Mapping, key: str, type_name: str, default: int | None, minimum: int = 0) -> int | None:
    """An integer option; its default when absent or null."""
    value = params.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise CriterionConfigError(f"{type_name}: '{key}' must be an integer >= {minimum}, got {value!r}")
    return value


def opt_number(params: Mapping, key: str, type_name: str, default: float, low: float, high: float) -> float:
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise CriterionConfigError(f"{type_name}: '{key}' must be a number in [{low}, {high}], got {value!r}")
    return float(value)


def str_list(params: Mapping, key: str, type_name: str, required: bool = False) -> list[str]:
    value = params.get(key)
    if value is None and not required:
        return []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise CriterionConfigError(f"{type_name}: '{key}' must be a list of strings")
    return value


def check_regex(pattern: str, flags: int, what: str) -> None:
    if is_templated(pattern):
        return
    try:
        re.compile(pattern, flags)
    except (re.error, ValueError) as exc:
        raise CriterionConfigError(f"{what}: invalid regular expression {pattern!r}: {exc}") from exc


def check_rel_path(value: str, what: str) -> None:
    """Paths are relative to the workspace and may not climb out of it."""
    path = PurePosixPath(value)
    if path.is_absolute() or value.startswith("~"):
        raise CriterionConfigError(f"{what}: path {value!r} must be relative to the workspace")
    if ".." in path.parts:
        raise CriterionConfigError(f"{what}: path {value!r} may not contain '..'")


def req_path(params: Mapping, key: str, type_name: str) -> str:
    value = req_str(params, key, type_name)
    check_rel_path(value, f"{type_name}: '{key}'")
    return value


# ---------------------------------------------------------------- workspace access


def resolve_under(root: Path, rel: str, shared: tuple[Path, ...] = ()) -> tuple[Path | None, str | None]:
    """The resolved path of `rel` under `root`, or (None, why) when it leaves root or is missing.

    A symlink the agent planted pointing outside is a failed check, not an error: the agent
    caused it, and following it could copy the worker's files into the details.
    """
    check_rel_path(rel, "path")
    root = root.resolve()
    resolved = (root / rel).resolve()
    if not resolved.is_relative_to(root) and not any(resolved.is_relative_to(p.resolve()) for p in shared):
        return None, f"'{rel}' resolves outside its folder"
    if not resolved.exists():
        return None, f"'{rel}' does not exist"
    return resolved, None


def read_text_under(root: Path, rel: str, shared: tuple[Path, ...] = ()) -> tuple[str | None, str | None]:
    """The file's text (capped at MAX_FILE_BYTES), or (None, why it could not be read)."""
    path, problem = resolve_under(root, rel, shared)
    if path is None:
        return None, problem
    # A FIFO or device would block or stream forever; only regular files are read.
    if not path.is_file():
        return None, f"'{rel}' is not a regular file"
    with path.open("rb") as handle:
        data = handle.read(MAX_FILE_BYTES)
    return data.decode("utf-8", errors="replace"), None


def workspace_path(ctx: GradingContext, rel: str) -> tuple[Path | None, str | None]:
    return resolve_under(ctx.workspace, rel, ctx.shared_roots)


def read_text(ctx: GradingContext, rel: str) -> tuple[str | None, str | None]:
    return read_text_under(ctx.workspace, rel, ctx.shared_roots)


def cap(text: str, limit: int = OUTPUT_BUDGET) -> str:
    """Keep the head of a long text and say how much was dropped."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n… ({len(text) - limit} more chars truncated)"


def clamp_score(value: Any, what: str) -> float:
    """A finite number in [0, 1]; anything else is a grader bug (an error, never a fail)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{what} returned a score that is not a finite number: {value!r}")
    return min(1.0, max(0.0, float(value)))
