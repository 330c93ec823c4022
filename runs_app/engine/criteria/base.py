"""Shared pieces of grading: the context a criterion sees, results, parameter checks, and the
readers of the agent's workspace, which turn whatever it holds into a failed check, not an error.

Nothing here imports Django; every helper is a small function.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import select
import signal
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, overload

# Per-stream budget for command output and file excerpts kept in details (coder-eval keeps 4000).
OUTPUT_BUDGET = 4000
# Files larger than this are not read (the check fails, naming the size): a 1 GB file written by
# an agent must not fill the worker's memory, and half a file cannot be checked.
MAX_FILE_BYTES = 16 * 1024 * 1024
# How long a regular expression or a JSON schema may work on the agent's content (`bounded`).
BOUNDED_SECONDS = 20.0
# What details keep of a match.
MATCH_EXCERPT = 200
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


@dataclass(frozen=True)
class JudgeAgentRequest:
    """An agent_judge's run: its prompts, its Claude Code options (`model`, `permission_mode`,
    `allowed_tools`, ... as the claude-code kind reads them), where the reference goes (`_reference/`
    of its copy of the workspace) and which names its copy leaves out."""

    system_prompt: str
    prompt: str
    options: dict
    max_turns: int
    timeout_seconds: float
    reference_dir: Path | None
    ignore_patterns: tuple[str, ...]


@dataclass
class JudgeAgentRun:
    """How the judge's run ended: its tool calls (`{"name", "input", ...}`), its last reply, and why
    it failed, if it did (`timed_out` for its wall clock)."""

    tool_calls: list[dict] = field(default_factory=list)
    final_text: str = ""
    error: str | None = None
    timed_out: bool = False
    usage: dict = field(default_factory=dict)


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
    # Names a glob `path` may not find (`glob_matches`): coder-eval's default ignore list with the
    # task's sandbox.ignore_patterns applied, as the runner computes them.
    ignore_patterns: frozenset[str] = frozenset()
    # How a criterion asks a model (llm_judge): the worker's judge gateway, which counts the call
    # as the judge's; `post_model(body, timeout)` returns the reply. None: straight to the API.
    post_model: Callable[[dict, float], dict] | None = None
    # How a criterion runs an agent as judge (agent_judge): in a copy of the workspace, in the
    # trial's sandbox, through the judge's gateway. None: no worker to run it.
    run_judge_agent: Callable[[JudgeAgentRequest], JudgeAgentRun] | None = None
    # How a container criterion runs its script (`verifier`): `run_verifier(params)` returns its
    # rewards by name and details, or raises ValueError (no usable reward). None: not a container.
    run_verifier: Callable[[dict], tuple[dict[str, float], dict]] | None = None


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

# What the workspace's content can make a read fail with: the agent left a link loop, a path too
# long or through a file, a mode it may not read, a socket. A failed check, never an error; any
# other errno (EIO, EMFILE, ENOMEM...) is the worker's trouble and stays an exception (an error).
CONTENT_ERRNOS = {
    errno.ENOENT: "does not exist",
    errno.ENOTDIR: "does not exist (a part of its path is not a folder)",
    errno.ELOOP: "is a loop of symbolic links",
    errno.ENAMETOOLONG: "has a path too long to open",
    errno.EACCES: "cannot be read (permission denied)",
    errno.EPERM: "cannot be read (operation not permitted)",
    errno.ENXIO: "is a socket or a device without a reader",
    errno.EISDIR: "is a folder",
}
FILE_KINDS = {
    stat.S_IFREG: "a regular file",
    stat.S_IFDIR: "a folder",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFLNK: "a symbolic link",
}


def content_problem(rel: str, exc: OSError) -> str:
    """What an OSError met while reading `rel` says about the workspace; re-raises any other."""
    if exc.errno not in CONTENT_ERRNOS:
        raise exc
    return f"'{rel}' {CONTENT_ERRNOS[exc.errno]}"


def kind_of(mode: int) -> str:
    return FILE_KINDS.get(stat.S_IFMT(mode), "a special file")


def printable(name: str) -> str:
    """A file name as the agent wrote it, as text any page and database can hold: bytes that are
    not UTF-8 as \\xff, control characters (a newline in a name) escaped."""
    text = os.fsencode(name).decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def resolve_under(root: Path, rel: str, shared: tuple[Path, ...] = ()) -> tuple[Path | None, str | None]:
    """The resolved path of `rel` under `root`, or (None, why) when it leaves root or is missing.

    A symlink the agent planted pointing outside is a failed check, not an error: the agent
    caused it, and following it could copy the worker's files into the details. So is a link
    loop, or any other path the workspace's content makes unreadable (`CONTENT_ERRNOS`).
    """
    check_rel_path(rel, "path")
    # realpath, unlike Path.resolve on Python 3.11, never raises on a link loop.
    root = Path(os.path.realpath(root))
    resolved = Path(os.path.realpath(root / rel))
    if not resolved.is_relative_to(root) and not any(
        resolved.is_relative_to(os.path.realpath(p)) for p in shared
    ):
        return None, f"'{rel}' resolves outside its folder (to {printable(str(resolved))})"
    try:
        resolved.stat()
    except OSError as exc:
        return None, content_problem(rel, exc)
    return resolved, None


def read_text_under(root: Path, rel: str, shared: tuple[Path, ...] = ()) -> tuple[str | None, str | None]:
    """The file's text, or (None, why it could not be read): only a regular file of at most
    MAX_FILE_BYTES is read (a larger one could not be checked whole)."""
    path, problem = resolve_under(root, rel, shared)
    if path is None:
        return None, problem
    try:
        # A FIFO or device would block or stream forever: only a regular file is opened (and
        # without waiting for a writer, should it have become a FIFO since).
        if problem := _not_readable(rel, os.stat(path)):
            return None, problem
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        return None, content_problem(rel, exc)
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:  # it grew since stat
        return None, f"'{rel}' is over the {MAX_FILE_BYTES} bytes a criterion reads"
    return data.decode("utf-8", errors="replace"), None


def _not_readable(rel: str, info: os.stat_result) -> str | None:
    if not stat.S_ISREG(info.st_mode):
        return f"'{rel}' is {kind_of(info.st_mode)}, not a regular file"
    if info.st_size > MAX_FILE_BYTES:
        return f"'{rel}' is {info.st_size} bytes, over the {MAX_FILE_BYTES} a criterion reads"
    return None


def workspace_path(ctx: GradingContext, rel: str) -> tuple[Path | None, str | None]:
    return resolve_under(ctx.workspace, rel, ctx.shared_roots)


def read_text(ctx: GradingContext, rel: str) -> tuple[str | None, str | None]:
    """The text of the file a criterion's `path` names (a glob: its one match), or why not."""
    target, problem = one_file(ctx, rel)
    if target is None:
        return None, problem
    return read_text_under(ctx.workspace, target, ctx.shared_roots)


# ---------------------------------------------------------------- glob paths, as coder-eval reads them

GLOB_CHARS = frozenset("*?[")
MATCHES_LISTED = 10  # a wide pattern's matches, named in the details


def is_glob(rel: str) -> bool:
    return bool(GLOB_CHARS & set(rel))


def literal_exists(ctx: GradingContext, rel: str) -> bool:
    """A path that exists as written is never read as a pattern (coder-eval: "literal first")."""
    return os.path.exists(os.path.join(ctx.workspace, rel))


def one_file(ctx: GradingContext, rel: str) -> tuple[str | None, str | None]:
    """The workspace path a content criterion reads for `rel`, as coder-eval's
    `Sandbox.get_file_content` resolves it: the path as written when it exists or holds no glob
    character; else the pattern's one matching file. No match, or several (coder-eval refuses to
    guess which one to grade), is a failed check: (None, why)."""
    if not is_glob(rel) or literal_exists(ctx, rel):
        return rel, None
    matches, problem = glob_matches(ctx, rel)
    if problem is not None:
        return None, problem
    if not matches:
        return None, f"no file matches '{rel}' in the workspace"
    if len(matches) > 1:
        listed = ", ".join(printable(match) for match in matches[:MATCHES_LISTED])
        more = f", +{len(matches) - MATCHES_LISTED} more" if len(matches) > MATCHES_LISTED else ""
        return None, (
            f"pattern '{rel}' matches {len(matches)} files, and a criterion grades one: "
            f"{listed}{more} (coder-eval refuses to guess too)"
        )
    return matches[0], None


def graded_path(ctx: GradingContext, rel: str) -> dict[str, str]:
    """`{"path": rel}`, with `resolved` (the one file read) when `rel` is a pattern: which file was
    graded is most of what a glob's result says (coder-eval's `resolved_path_label`)."""
    if not is_glob(rel) or literal_exists(ctx, rel):
        return {"path": rel}
    target, _ = one_file(ctx, rel)
    return {"path": rel, "resolved": printable(target)} if target is not None else {"path": rel}


def glob_matches(ctx: GradingContext, rel: str) -> tuple[list[str], str | None]:
    """The regular files (links followed inside the workspace) that pattern `rel` matches, sorted,
    as coder-eval's `Sandbox.resolve_files` finds them on Python 3.13: folders never match, and a
    match whose path has a part the pattern found (not written out) in `ctx.ignore_patterns`
    (`.git`, `node_modules`, `*.pyc`...) is left out; `dist/**/*.js` names `dist` and keeps it."""
    root = Path(os.path.realpath(ctx.workspace))
    written = {part for part in rel.split("/") if part and not is_glob(part)}
    matches = []
    try:
        for found in root.glob(_as_python_313_reads(rel)):
            # realpath, not Path.resolve: a link loop must not raise (Python 3.11).
            target = os.path.realpath(found)
            if not Path(target).is_relative_to(root) or not os.path.isfile(target):
                continue
            relative = found.relative_to(root)
            found_parts = [part for part in relative.parts if part not in written]
            if any(_ignored_part(part, ctx.ignore_patterns) for part in found_parts):
                continue
            matches.append(relative.as_posix())
    except OSError as exc:  # a folder the search cannot enter: nested too deep, unreadable
        return [], content_problem(f"{rel} (searching the workspace)", exc)
    except ValueError as exc:  # a pattern pathlib cannot read
        return [], f"'{rel}' is not a pattern a search can use: {exc}"
    return sorted(set(matches)), None


def _as_python_313_reads(pattern: str) -> str:
    """coder-eval runs on Python 3.13, whose pathlib reads a final `**` as every file and folder
    below (3.11: folders only) and `**` inside a name as `*` (3.11 refuses it): the 3.11 pattern
    that finds the same files."""
    parts = [part if part == "**" else re.sub(r"\*{2,}", "*", part) for part in pattern.split("/")]
    if parts and parts[-1] == "**":
        parts.append("*")
    return "/".join(parts)


def _ignored_part(part: str, patterns: frozenset[str]) -> bool:
    """coder-eval's `matches_pattern`: `*x` is a suffix, `x*` a prefix, anything else the whole name."""
    for pattern in patterns:
        if pattern.startswith("*"):
            if part.endswith(pattern[1:]):
                return True
        elif pattern.endswith("*"):
            if part.startswith(pattern[:-1]):
                return True
        elif part == pattern:
            return True
    return False


# ---------------------------------------------------------------- bounded work on content


class BoundedCallFailed(RuntimeError):
    """The child computing a bounded call died or raised: a bug of the grader, an error."""


def bounded(function: Callable[[], Any], seconds: float | None = None) -> tuple[Any, str | None]:
    """`function()` (its result JSON-serialisable) in a forked child, killed after `seconds`:
    (result, None), or (None, what took too long).

    For a regular expression or a JSON schema on the agent's content: a search such as `\\w+=`
    over a 16 MB line of letters backtracks for hours, and Python cannot interrupt it; in the
    worker it would hold the GIL and stall every trial of the process.
    """
    seconds = BOUNDED_SECONDS if seconds is None else seconds
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: compute, write, and leave without running the worker's exit code
        try:
            os.close(reader)
            try:
                reply = {"value": function()}
            except BaseException as exc:
                reply = {"raised": f"{type(exc).__name__}: {exc}"}
            with os.fdopen(writer, "wb") as out:
                out.write(json.dumps(reply).encode())
        finally:
            os._exit(0)
    os.close(writer)
    chunks: list[bytes] = []
    deadline = time.monotonic() + seconds
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([reader], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                return None, f"did not finish within {seconds:g} s"
            chunk = os.read(reader, 1 << 16)
            if not chunk:  # the child wrote its reply and left
                break
            chunks.append(chunk)
    finally:
        os.close(reader)
        os.waitpid(pid, 0)
    try:
        reply = json.loads(b"".join(chunks))
    except ValueError:
        raise BoundedCallFailed("the child of a bounded call ended without a reply") from None
    if "raised" in reply:
        raise BoundedCallFailed(reply["raised"])
    return reply["value"], None


def search(pattern: str, text: str, flags: int = 0) -> tuple[str | None, str | None]:
    """The first match of `pattern` in the agent's `text` (its first MATCH_EXCERPT characters) or
    None, and a problem when the search did not finish in time (the check then fails)."""
    compiled = re.compile(pattern, flags)  # here, so a bad pattern (from a dataset row) is an error

    def first_match() -> str | None:
        match = compiled.search(text)
        return match.group()[:MATCH_EXCERPT] if match else None

    found, problem = bounded(first_match)
    return found, (f"searching for {pattern!r} {problem}" if problem else None)


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
