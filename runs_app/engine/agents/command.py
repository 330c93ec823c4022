"""The ``command`` agent: any CLI, with the prompt on stdin (default) or in a file.

Config keys: ``command`` (a string run with ``sh -c``, or an argv list; required), ``prompt_via``
(``stdin`` | ``file``: writes PROMPT.md in the workspace and sets EVALSITE_PROMPT_FILE), ``env``
(extra non-secret variables), ``secrets`` (names of worker variables to pass in), ``task_id``
(set by the runner, exported as EVALSITE_TASK_ID).

Its stdout may speak a JSON-lines protocol, one object per line; any other line is plain output:
    {"type": "message", "text": "..."}
    {"type": "tool_call", "name": "Bash", "input": {"command": "pytest"}, "status": "success"|"error"}
    {"type": "usage", "input_tokens": 10, "output_tokens": 5, "cost_usd": 0.001}   (adds up; one turn
        per line unless it says "turns"; also cache_read_tokens, cache_creation_tokens)
    {"type": "error", "message": "...", "category": "api_error"}
    {"type": "session", "id": "..."}   (what the next turn of a conversation resumes)

In a simulated conversation every turn runs the command again, with the simulated user's reply as
its prompt: EVALSITE_TURN is the turn (1, 2...), EVALSITE_SESSION_ID the session the last turn
reported (empty if none). What the command keeps in its HOME or workspace carries over.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from experiments_app.specs.agent_kinds import KINDS

from .base import (
    AgentEvent,
    AgentInvocation,
    AgentKind,
    AgentSetupError,
    BaseParser,
    mapping,
    raise_problems,
    require_secrets,
)

PROMPT_FILE = "PROMPT.md"


class CommandAgent(AgentKind):
    info = KINDS["command"]
    name = info.name

    def prepare(
        self, prompt: str, workspace: Path, home: Path, config: Mapping[str, Any], secrets: Mapping[str, str]
    ) -> AgentInvocation:
        argv = _argv(config.get("command"))
        names = list(config.get("secrets") or [])
        raise_problems(require_secrets("command agent", names, secrets))
        env = {str(k): str(v) for k, v in (config.get("env") or {}).items()}
        env["EVALSITE_TASK_ID"] = str(config.get("task_id", ""))
        env["EVALSITE_TURN"] = str(config.get("turn", 1))
        env["EVALSITE_SESSION_ID"] = str(config.get("session", ""))
        via = config.get("prompt_via", "stdin")
        if via == "stdin":
            return AgentInvocation(argv=argv, stdin=prompt.encode(), env_extra=env, secrets_needed=names)
        if via == "file":
            prompt_path = workspace / PROMPT_FILE
            env["EVALSITE_PROMPT_FILE"] = str(prompt_path)
            return AgentInvocation(
                argv=argv,
                stdin=b"",
                env_extra=env,
                secrets_needed=names,
                files_to_write={str(prompt_path): prompt.encode()},
            )
        raise AgentSetupError(f"command agent: prompt_via must be 'stdin' or 'file', not {via!r}")

    def parser(self, config: Mapping[str, Any] | None = None) -> CommandParser:
        return CommandParser()

    def resume(
        self,
        prompt: str,
        session: str,
        workspace: Path,
        home: Path,
        config: Mapping[str, Any],
        secrets: Mapping[str, str],
    ) -> AgentInvocation:
        return self.prepare(prompt, workspace, home, {**config, "session": session}, secrets)


def _argv(command: Any) -> list[str]:
    if isinstance(command, str) and command.strip():
        return ["sh", "-c", command]
    if isinstance(command, list) and command and all(isinstance(part, str) for part in command):
        return list(command)
    raise AgentSetupError(
        "command agent: set `command` in the variant's agent options, as a shell string "
        "(run with sh -c) or a list of arguments"
    )


class CommandParser(BaseParser):
    def _parse(self, obj: dict[str, Any]) -> list[AgentEvent] | None:
        kind = obj.get("type")
        if kind == "message" and isinstance(obj.get("text"), str):
            self.final_text = obj["text"]
            return [AgentEvent("message", {"text": obj["text"]})]
        if kind == "tool_call" and isinstance(obj.get("name"), str):
            return self._tool_call(obj)
        if kind == "usage":
            return self._usage(obj)
        if kind == "session" and isinstance(obj.get("id"), str):
            self.session_id = obj["id"]
            return [AgentEvent("system", {"subtype": "session", "session_id": obj["id"]})]
        if kind == "error":
            self.error = str(obj.get("message") or "the agent reported an error")
            self.error_category = str(obj.get("category") or "agent_error")
            return [AgentEvent("error", {"message": self.error, "category": self.error_category})]
        return None

    def _tool_call(self, obj: dict[str, Any]) -> list[AgentEvent]:
        tool_input = mapping(obj.get("input"))
        call_id = str(obj.get("id") or f"call_{len(self.tool_calls)}")
        event = self._add_tool_call(call_id, obj["name"], tool_input)
        failed = obj.get("status") == "error" or obj.get("is_error") is True
        self._calls_by_id[call_id]["status"] = "error" if failed else "success"
        return [event] if event else []

    def _usage(self, obj: dict[str, Any]) -> list[AgentEvent]:
        usage = self.usage
        usage.input_tokens += _count(obj.get("input_tokens"))
        usage.output_tokens += _count(obj.get("output_tokens"))
        usage.cache_read_tokens += _count(obj.get("cache_read_tokens"))
        usage.cache_creation_tokens += _count(obj.get("cache_creation_tokens"))
        usage.turns += _count(obj.get("turns", 1))
        cost = _cost(obj.get("cost_usd"))
        if cost is not None:
            usage.cost_usd = (usage.cost_usd or 0.0) + cost
        return [self._usage_event()]


# A script's numbers are counted only up to these per line: beyond, they are a bug of the script,
# and summed they would overflow the stored columns (or, for a cost, become infinite).
MAX_REPORTED_TOKENS = 10**9
MAX_REPORTED_COST_USD = 1e6


def _count(value: Any) -> int:
    # A malformed, negative or absurd number from a user's script must neither crash the trial
    # (int(inf) raises OverflowError) nor lower a total: count it as zero.
    if isinstance(value, bool):
        return 0
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return 0
    return number if 0 <= number <= MAX_REPORTED_TOKENS else 0


def _cost(value: Any) -> float | None:
    """A reported cost, or None (ignored) unless it is a number in [0, MAX_REPORTED_COST_USD]: a
    negative one would make the variant look cheaper, NaN or infinity would spoil every mean."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        cost = float(value)
    except OverflowError:  # an integer past float's range
        return None
    return cost if 0.0 <= cost <= MAX_REPORTED_COST_USD else None
