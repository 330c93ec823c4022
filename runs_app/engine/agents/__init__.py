"""Agent kinds, found by name: the implementation behind each name of the one kind registry
(`experiments_app.specs.agent_kinds`: a descriptor row per built-in kind, plus the
``evalsite.agents`` entry points).

One module per built-in kind, named after it (`claude-code`: `claude_code.py`): a command line
plus a parser of its output (no Django).
"""

from __future__ import annotations

import importlib
from importlib.metadata import EntryPoint

from experiments_app.specs import agent_kinds
from experiments_app.specs.agent_kinds import ENTRY_POINT_GROUP, KINDS, known_kinds

from .base import (
    AgentEvent,
    AgentInvocation,
    AgentKind,
    AgentOutcome,
    AgentSetupError,
    UnknownAgentKind,
    write_files,
)

__all__ = [
    "AgentEvent",
    "AgentInvocation",
    "AgentKind",
    "AgentOutcome",
    "AgentSetupError",
    "UnknownAgentKind",
    "get_agent",
    "known_kinds",
    "write_files",
]


def _implementation(name: str) -> type[AgentKind]:
    """The class of a built-in kind: the AgentKind of its module whose `info` is the kind's row."""
    module = importlib.import_module(f"{__name__}.{KINDS[name].module}")
    for value in vars(module).values():
        if isinstance(value, type) and issubclass(value, AgentKind) and value.info is KINDS[name]:
            return value
    raise ImportError(f"{module.__name__} defines no AgentKind with info = KINDS[{name!r}]")


BUILTIN_KINDS: dict[str, type[AgentKind]] = {name: _implementation(name) for name in KINDS}


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
