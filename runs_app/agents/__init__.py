"""Agent kinds, found by name: the built-ins plus third-party kinds from installed packages.

A package adds a kind with an entry point in the ``evalsite.agents`` group, e.g. in pyproject.toml:

    [project.entry-points."evalsite.agents"]
    my-agent = "my_package.agent:MyAgent"    # an AgentKind subclass (or instance)

Built-in names always win, so an installed package cannot replace them.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

from .base import (
    AgentEvent,
    AgentInvocation,
    AgentKind,
    AgentOutcome,
    AgentSetupError,
    UnknownAgentKind,
    Usage,
    budget_exceeded,
    write_files,
)
from .claude_code import ClaudeCodeAgent
from .codex import CodexAgent
from .command import CommandAgent
from .none import NoneAgent
from .oracle import OracleAgent

ENTRY_POINT_GROUP = "evalsite.agents"

BUILTIN_KINDS: dict[str, type[AgentKind]] = {
    "none": NoneAgent,
    "oracle": OracleAgent,
    "command": CommandAgent,
    "claude-code": ClaudeCodeAgent,
    "codex": CodexAgent,
}

__all__ = [
    "AgentEvent",
    "AgentInvocation",
    "AgentKind",
    "AgentOutcome",
    "AgentSetupError",
    "UnknownAgentKind",
    "Usage",
    "budget_exceeded",
    "get_agent",
    "known_kinds",
    "write_files",
]


def known_kinds() -> list[str]:
    """Built-in kinds, then installed third-party kinds, sorted within each group."""
    extra = sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)} - set(BUILTIN_KINDS))
    return sorted(BUILTIN_KINDS) + extra


def get_agent(kind: str) -> AgentKind:
    if kind in BUILTIN_KINDS:
        return BUILTIN_KINDS[kind]()
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == kind:
            return _load(ep)
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
