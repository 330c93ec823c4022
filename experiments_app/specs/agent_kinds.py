"""The one registry of agent kind names: the built-ins plus the installed plugins (no Django).

A package adds a kind with an entry point in the ``evalsite.agents`` group, e.g. in pyproject.toml:

    [project.entry-points."evalsite.agents"]
    my-agent = "my_package.agent:MyAgent"    # an AgentKind subclass (or instance)

The task and experiment specs, the experiment form and the API read the names from here; the
engine (`runs_app.engine.agents`) turns a name into the kind's implementation. Built-in names
always win, so an installed package cannot replace them.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

ENTRY_POINT_GROUP = "evalsite.agents"
BUILTIN_KINDS = ("none", "oracle", "command", "claude-code", "codex")
# Agents that produce no trajectory, so criteria reading the agent's commands cannot apply.
AGENTLESS_KINDS = ("none",)


def plugin_entry_points() -> dict[str, EntryPoint]:
    """Installed third-party kinds by name (a built-in name is never taken by a plugin)."""
    found = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in BUILTIN_KINDS:
            found.setdefault(ep.name, ep)
    return found


def known_kinds() -> list[str]:
    """Built-in kinds, then installed third-party kinds, sorted within each group."""
    return sorted(BUILTIN_KINDS) + sorted(plugin_entry_points())


def is_known(kind: str) -> bool:
    return kind in BUILTIN_KINDS or kind in plugin_entry_points()


def check_kind(kind: str) -> str:
    """`kind` if it is known; else a ValueError listing the known kinds (specs and the API)."""
    if not is_known(kind):
        raise ValueError(f"unknown agent type {kind!r}; expected one of: {', '.join(known_kinds())}")
    return kind
