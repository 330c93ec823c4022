"""What every agent kind shares: events, usage, the invocation to run, the outcome.

An agent kind is pure Python and imports no Django. The runner drives it in three steps:

1. ``prepare(prompt, workspace, home, config, secrets)`` returns an ``AgentInvocation``: the argv,
   stdin, extra environment, the secret names to inject and files to write before the start.
   It raises ``AgentSetupError`` when the CLI or an API key is missing. In a simulated
   conversation each later turn is ``resume(prompt, session, ...)`` instead, where ``session``
   is the ``session_id`` the previous turn's parser read (kinds with ``can_resume``).
2. The runner starts the process (``sandbox.run_process``) and feeds every stdout line to
   ``parser.feed_line``. After each line it may compare ``parser.usage`` with the run limits
   (``budget_crossed``) and stop early; it also stops when ``parser.fatal`` is set.
3. ``finish(process_result, parser, limit_hit=...)`` classifies the end into an ``AgentOutcome``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from evalsite.agents_install import installing_note
from experiments_app.specs.agent_kinds import AgentKindInfo
from runs_app.engine.usage import Usage

EVENT_KINDS = ("message", "tool_call", "tool_result", "usage", "error", "system", "output")

# Outcome statuses, as hints for the runner:
#   completed: the agent ended on its own -> grade.
#   limit:     a limit stopped it (timeout, max_turns, a token/cost budget) -> grade, flag the limit.
#   error:     infrastructure failure (API down, bad key, crash) -> trial `error`, never a fail.
#   cancelled: the run was cancelled -> trial `cancelled`.
COMPLETED, LIMIT, ERROR, CANCELLED = "completed", "limit", "error", "cancelled"

# Stream errors that mean "a limit the agent itself enforces was reached": graded, flagged.
LIMIT_CATEGORIES = ("max_turns", "max_usd")

# Tool results and command output kept in events/tool calls are cut to this many characters.
MAX_TOOL_OUTPUT_CHARS = 2000


class AgentSetupError(Exception):
    """The agent cannot start (missing CLI, missing API key, bad config); the message says what to do."""


class UnknownAgentKind(ValueError):
    """No built-in or installed agent kind has this name."""


@dataclass
class AgentEvent:
    kind: str
    data: dict[str, Any]


@dataclass
class AgentInvocation:
    """What to run. ``argv`` None means no process (the kind did its work in ``prepare``).

    ``stdin`` b"" means: give the process an empty stdin that is closed at once (both CLIs wait on
    an open pipe). ``env_extra`` holds non-secret variables; ``secrets_needed`` names variables whose
    values the runner copies from the worker's environment (never stored, never shown).
    ``files_to_write`` maps absolute paths (inside the sandbox) to contents, written before start.
    """

    argv: list[str] | None
    stdin: bytes | None = None
    env_extra: dict[str, str] = field(default_factory=dict)
    secrets_needed: list[str] = field(default_factory=list)
    files_to_write: dict[str, bytes] = field(default_factory=dict)


@dataclass
class AgentOutcome:
    status: str  # COMPLETED | LIMIT | ERROR | CANCELLED
    usage: Usage
    error: str | None = None
    error_category: str | None = None  # auth, rate_limit, overloaded, api_error, connection, ...
    limit: str | None = None  # timeout, max_turns, max_total_tokens, max_usd
    exit_code: int | None = None
    final_text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    permission_denials: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class ProcessResultLike(Protocol):
    """The fields of ``sandbox.ProcessResult`` that ``finish`` reads."""

    @property
    def exit_code(self) -> int | None: ...
    @property
    def signal(self) -> int | None: ...
    @property
    def stdout(self) -> bytes | str: ...
    @property
    def stderr(self) -> bytes | str: ...
    @property
    def timed_out(self) -> bool: ...
    @property
    def cancelled(self) -> bool: ...
    @property
    def killed(self) -> bool: ...


class StreamParser(Protocol):
    """What the runner reads from a parser (``BaseParser`` implements it)."""

    usage: Usage
    tool_calls: list[dict[str, Any]]
    final_text: str
    error: str | None
    error_category: str | None
    fatal: str | None
    finished: bool

    def feed_line(self, line: str) -> list[AgentEvent]: ...


class BaseParser:
    """State common to the parsers. Subclasses implement ``_parse(obj)`` for JSON lines.

    ``error``/``error_category``: what the stream itself said went wrong.
    ``fatal``: set while the agent still runs when it cannot recover (bad key, server unreachable):
    the runner should stop the process instead of waiting for the wall-clock timeout.
    ``finished``: the stream reached its normal last line (a result / a finished turn).
    """

    def __init__(self) -> None:
        self.usage = Usage()
        self.tool_calls: list[dict[str, Any]] = []
        self.final_text = ""
        self.error: str | None = None
        self.error_category: str | None = None
        self.fatal: str | None = None
        self.fatal_category: str | None = None
        self.finished = False
        self.permission_denials: list[dict[str, Any]] = []
        # The session the CLI reported, which a later turn of a conversation resumes.
        self.session_id = ""
        self._calls_by_id: dict[str, dict[str, Any]] = {}

    def feed_line(self, line: str | bytes) -> list[AgentEvent]:
        if isinstance(line, bytes):
            line = line.decode("utf-8", errors="replace")
        line = line.strip()
        if not line:
            return []
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):  # nested past what Python parses: plain output
            obj = None
        # A line nested deeper than any protocol's is plain output: stored as parsed, it could
        # not be written back as JSON (Python encodes recursively).
        if isinstance(obj, dict) and nested_deeper(obj, MAX_PROTOCOL_DEPTH):
            obj = None
        events = self._parse(obj) if isinstance(obj, dict) else None
        return [AgentEvent("output", {"text": line})] if events is None else events

    def _parse(self, obj: dict[str, Any]) -> list[AgentEvent] | None:
        """Events for one JSON object, or None when the line is not part of the protocol."""
        raise NotImplementedError

    def _add_tool_call(self, call_id: str, name: str, tool_input: dict[str, Any]) -> AgentEvent | None:
        """Record a tool call once per id; returns its event, or None when already known."""
        if call_id and call_id in self._calls_by_id:
            return None
        call = {"id": call_id, "name": name, "input": tool_input, "status": "pending", "output": None}
        self.tool_calls.append(call)
        if call_id:
            self._calls_by_id[call_id] = call
        return AgentEvent("tool_call", {"id": call_id, "name": name, "input": tool_input})

    def _usage_event(self) -> AgentEvent:
        return AgentEvent("usage", self.usage.as_dict())


class AgentKind:
    """Base class of agent kinds. ``finish`` classifies the end; kinds whose stream has a terminal
    line set ``needs_final_line``."""

    # A built-in kind's row of the registry (`agent_kinds.KINDS`): its model APIs and whether it
    # can resume come from there. A plugin kind sets `model_apis` and `can_resume` itself.
    info: AgentKindInfo | None = None
    name = ""
    # A CLI whose stream ends with a result line: exiting without that line is an error.
    needs_final_line = False

    @property
    def model_apis(self) -> tuple[str, ...]:
        """The model APIs the kind calls ("anthropic", "openai"): the runner gives it the trial's
        gateway for them (placeholder keys, the gateway's URLs), which counts every call."""
        return self.info.providers if self.info is not None else ()

    @property
    def can_resume(self) -> bool:
        """Whether `resume` continues the agent's session with a new message (simulations)."""
        return self.info.can_resume if self.info is not None else False

    def apis(self, config: Mapping[str, Any]) -> tuple[str, ...]:
        """The model APIs this run of the kind calls (a kind's options may pick another one)."""
        return self.model_apis

    def prepare(
        self,
        prompt: str,
        workspace: Path,
        home: Path,
        config: Mapping[str, Any],
        secrets: Mapping[str, str],
    ) -> AgentInvocation:
        raise NotImplementedError

    def parser(self, config: Mapping[str, Any] | None = None) -> BaseParser:
        """A fresh parser for one run; ``config`` is the same agent config ``prepare`` got."""
        raise NotImplementedError

    def resume(
        self,
        prompt: str,
        session: str,
        workspace: Path,
        home: Path,
        config: Mapping[str, Any],
        secrets: Mapping[str, str],
    ) -> AgentInvocation:
        """The next turn of a conversation: `prompt` sent to the session the last turn opened."""
        raise AgentSetupError(f"agent kind {self.name} cannot resume a session")

    def finish(
        self, result: ProcessResultLike | None, parser: BaseParser, *, limit_hit: str | None = None
    ) -> AgentOutcome:
        return classify(result, parser, limit_hit=limit_hit, needs_final_line=self.needs_final_line)


def classify(
    result: ProcessResultLike | None,
    parser: BaseParser,
    *,
    limit_hit: str | None,
    needs_final_line: bool,
) -> AgentOutcome:
    """Turn a finished process plus what its stream said into an outcome.

    Steps, first match wins (the stream is trusted over the exit code):
    1. the runner stopped it for a budget (``limit_hit``) -> limit;
    2. the parser saw an unrecoverable problem (``fatal``) -> error, even if the runner then
       killed the process (that kill is the consequence, not a cancel);
    3. the runner cancelled it -> cancelled;
    4. the stream reported an error: ``max_turns``/``max_usd`` -> limit, anything else -> error,
       unless the wall clock had run out: the kill then comes first (a CLI stopped for its
       timeout loses its gateway's forwarder with it and may still report "Unable to connect");
    5. wall-clock timeout -> limit ``timeout``;
    6. killed by a signal nobody sent, or exit 126/127 -> error ``crash``;
    7. a CLI stream that never reached its last line -> error ``no_result``;
    8. otherwise completed (a non-zero exit of a plain command is noted, not an error).
    """
    outcome = AgentOutcome(
        status=COMPLETED,
        usage=parser.usage,
        exit_code=getattr(result, "exit_code", None),
        final_text=parser.final_text,
        tool_calls=parser.tool_calls,
        permission_denials=parser.permission_denials,
    )
    if limit_hit:
        return _set(outcome, LIMIT, f"stopped: the agent's usage crossed {limit_hit}", None, limit_hit)
    if parser.fatal:
        return _set(outcome, ERROR, parser.fatal, parser.fatal_category or "api_error")
    if result is None:
        return outcome
    if result.cancelled:
        return _set(outcome, CANCELLED, "cancelled while the agent was running", "cancelled")
    if parser.error and parser.error_category in LIMIT_CATEGORIES:
        category = parser.error_category
        return _set(outcome, LIMIT, parser.error, category, category)
    if parser.error and not result.timed_out:
        return _set(outcome, ERROR, parser.error, parser.error_category or "agent_error")
    if result.timed_out:
        return _set(outcome, LIMIT, "the agent ran past its wall-clock timeout", None, "timeout")
    if result.signal and not result.killed:
        return _set(
            outcome, ERROR, f"the agent died from signal {result.signal}{_stderr_tail(result)}", "crash"
        )
    if result.exit_code in (126, 127):
        return _set(outcome, ERROR, f"the agent command could not run{_stderr_tail(result)}", "crash")
    if needs_final_line and not parser.finished:
        message = f"the agent exited (code {result.exit_code}) before its final result line"
        return _set(outcome, ERROR, message + _stderr_tail(result), "no_result")
    if result.exit_code:
        outcome.notes.append(f"exit code {result.exit_code}")
    return outcome


def _set(
    outcome: AgentOutcome, status: str, error: str, category: str | None, limit: str | None = None
) -> AgentOutcome:
    outcome.status, outcome.error, outcome.error_category, outcome.limit = status, error, category, limit
    return outcome


def _stderr_tail(result: ProcessResultLike, chars: int = 500) -> str:
    text = as_text(getattr(result, "stderr", "") or "").strip()
    return f": {text[-chars:]}" if text else ""


MAX_PROTOCOL_DEPTH = 64


def nested_deeper(data: Any, limit: int) -> bool:
    """Whether arrays and objects nest more than `limit` levels (without recursion)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def mapping(value: Any) -> dict[str, Any]:
    """`value` if it is a JSON object, else an empty one (a CLI's stream may omit or garble a field)."""
    return value if isinstance(value, dict) else {}


def as_text(data: bytes | str) -> str:
    return data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data


def clip(text: str, limit: int = MAX_TOOL_OUTPUT_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"… [{len(text) - limit} more characters]"


def write_files(invocation: AgentInvocation) -> None:
    """Write ``files_to_write`` (the runner calls this after building the sandbox)."""
    for name, content in invocation.files_to_write.items():
        path = Path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)


def require_secrets(kind: str, names: list[str], secrets: Mapping[str, str]) -> list[str]:
    """Problems for the secrets that are missing or empty, worded as what to set."""
    return [
        f"{kind} needs the API key {name}: set {name} in the environment of the worker process "
        "(it is read there at run time, never stored)"
        for name in names
        if not secrets.get(name)
    ]


def raise_problems(problems: list[str]) -> None:
    if problems:
        raise AgentSetupError("; ".join(problems))


# <project>/node_modules/.bin holds the CLIs installed by `npm ci` from the project's package.json.
PROJECT_ROOT = Path(__file__).resolve().parents[3]
INSTALL_HINT = (
    "run `make agents` in the project root (it installs the pinned CLIs into node_modules/ and .agents/)"
)

# Prompts this long (or starting with "-", which a CLI would read as an option) go on stdin:
# one argv string may not exceed 128 KiB on Linux.
MAX_ARGV_PROMPT_BYTES = 100_000


def prompt_fits_argv(prompt: str) -> bool:
    return not prompt.startswith("-") and len(prompt.encode()) <= MAX_ARGV_PROMPT_BYTES


def find_cli(
    kind: str, program: str, config: Mapping[str, Any], env_var: str
) -> tuple[str | None, str | None]:
    """Locate a CLI: config ``binary``, then $env_var, then node_modules/.bin, then PATH.

    Returns (path, None) or (None, problem) where the problem says what to install or set.
    """
    for source, value in (
        ("the variant's `binary` option", config.get("binary")),
        (env_var, os.environ.get(env_var)),
    ):
        if value:
            found = shutil.which(str(value))
            if found:
                return found, None
            return None, f"{kind}: {source} points to {value}, which is not an executable file"
    local = PROJECT_ROOT / "node_modules" / ".bin" / program
    for installed in (local, PROJECT_ROOT / ".agents" / program / "bin" / program):
        if os.access(installed, os.X_OK):
            return str(installed), None
    found = shutil.which(program)
    if found:
        return found, None
    return None, (
        f"{kind}: the `{program}` CLI is not installed ({local} is missing and it is not on PATH); "
        f"{INSTALL_HINT}, or set {env_var} to its path{installing_note()}"
    )


def require_cli(
    info: AgentKindInfo | None, api_key: str, config: Mapping[str, Any], secrets: Mapping[str, str]
) -> str:
    """The path of a kind's model CLI (see ``find_cli``), once both it and its API key are there.

    Raises ``AgentSetupError`` naming every problem at once: what to install and which key to set.
    """
    assert info is not None and info.cli  # a built-in kind that drives a CLI
    binary, problem = find_cli(info.name, info.cli, config, info.cli_variable)
    problems = [problem] if problem else []
    problems += require_secrets(info.name, [api_key], secrets)
    raise_problems(problems)
    assert binary is not None  # find_cli returns a path or a problem
    return binary
