"""Agent kinds, found by name: the implementation behind each name of the one kind registry
(`experiments_app.specs.agent_kinds`: the built-ins plus the ``evalsite.agents`` entry points).

One module per built-in kind: a command line plus a parser of its output (no Django).
"""

from __future__ import annotations

from importlib.metadata import EntryPoint

from experiments_app.specs import agent_kinds
from experiments_app.specs.agent_kinds import ENTRY_POINT_GROUP, known_kinds

from .aider import AiderAgent
from .base import (
    AgentEvent,
    AgentInvocation,
    AgentKind,
    AgentOutcome,
    AgentSetupError,
    UnknownAgentKind,
    Usage,
    budget_crossed,
    write_files,
)
from .claude_code import ClaudeCodeAgent
from .codex import CodexAgent
from .command import CommandAgent
from .gemini_cli import GeminiCliAgent
from .none import NoneAgent
from .opencode import OpencodeAgent
from .oracle import OracleAgent

BUILTIN_KINDS: dict[str, type[AgentKind]] = {
    "none": NoneAgent,
    "oracle": OracleAgent,
    "command": CommandAgent,
    "claude-code": ClaudeCodeAgent,
    "codex": CodexAgent,
    "gemini-cli": GeminiCliAgent,
    "opencode": OpencodeAgent,
    "aider": AiderAgent,
}

__all__ = [
    "AgentEvent",
    "AgentInvocation",
    "AgentKind",
    "AgentOutcome",
    "AgentSetupError",
    "UnknownAgentKind",
    "Usage",
    "budget_crossed",
    "get_agent",
    "known_kinds",
    "write_files",
]


if set(BUILTIN_KINDS) != set(agent_kinds.BUILTIN_KINDS):
    raise ImportError("every built-in agent kind of experiments_app.specs.agent_kinds needs its module here")


def get_agent(kind: str) -> AgentKind:
    if kind in BUILTIN_KINDS:
        return BUILTIN_KINDS[kind]()
    plugin = agent_kinds.plugin_entry_points().get(kind)
    if plugin is not None:
        return _load(plugin)
    raise UnknownAgentKind(
        f"unknown agent kind {kind!r}; known kinds: {', '.join(known_kinds())} "
        f"(packages add kinds through the {ENTRY_POINT_GROUP!r} entry-point group)"
    )


def _load(ep: EntryPoint) -> AgentKind:
    try:
        target = ep.load()
        agent = target() if isinstance(target, type) else target
    except Exception as exc:  # a broken plugin must say which one, not crash the worker obscurely
        raise AgentSetupError(f"agent kind {ep.name!r} from {ep.value} failed to load: {exc}") from exc
    if not isinstance(agent, AgentKind):
        raise AgentSetupError(
            f"agent kind {ep.name!r} from {ep.value} is not an AgentKind (got {type(agent).__name__})"
        )
    if not agent.name:
        agent.name = ep.name
    return agent
