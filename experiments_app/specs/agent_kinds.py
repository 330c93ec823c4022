"""The one registry of agent kind names: the built-ins plus the installed plugins (no Django).

A package adds a kind with an entry point in the ``evalsite.agents`` group, e.g. in pyproject.toml:

    [project.entry-points."evalsite.agents"]
    my-agent = "my_package.agent:MyAgent"    # an AgentKind subclass (or instance)

The task and experiment specs, the experiment form and the API read the names from here; the
engine (`runs_app.engine.agents`) turns a name into the kind's implementation. Built-in names
always win, so an installed package cannot replace them.
"""

from __future__ import annotations

import difflib
from importlib.metadata import EntryPoint, entry_points

ENTRY_POINT_GROUP = "evalsite.agents"
BUILTIN_KINDS = ("none", "oracle", "command", "claude-code", "codex", "gemini-cli", "opencode", "aider")
# Agents that produce no trajectory, so criteria reading the agent's commands cannot apply.
AGENTLESS_KINDS = ("none",)
# Kinds whose run has no tool calls to watch, so no criterion can stop them early.
UNWATCHED_KINDS = ("none", "oracle")
# The kind a task runs when no layer names one (coder-eval's default).
DEFAULT_KIND = "claude-code"

# The options each built-in kind reads (`runs_app.engine.agents.*` and the runner); any other key
# under `agent` is an error naming the kinds it applies to. Every kind takes the common ones
# (`model` too: an experiment's default model may reach a `none` or `oracle` variant).
COMMON_OPTIONS = frozenset({"type", "model", "env", "secrets", "prices"})
KIND_OPTIONS: dict[str, frozenset[str]] = {
    "none": frozenset(),
    "oracle": frozenset(),
    "command": frozenset({"command", "script", "prompt_via"}),
    "claude-code": frozenset(
        {
            "binary",
            "permission_mode",
            "allowed_tools",
            "disallowed_tools",
            "max_turns",
            "append_system_prompt",
            "system_prompt",
            "system_prompt_file",
            "include_partial_messages",
            "max_budget_usd",
            "max_retries",
            "base_url",
            "provider",
            "region",
            "project_id",
            "extra_args",
            # Still accepted without effect, as before: coder-eval's own examples set it, and
            # mapping it onto the CLI is open work (noted on issue 11).
            "sdk_options",
        }
    ),  # fmt: skip
    "codex": frozenset(
        {
            "binary",
            "sandbox",
            "base_url",
            "max_retries",
            "request_max_retries",
            "stream_max_retries",
            "reasoning_effort",
            "network_retry_limit",
            "extra_args",
        }
    ),  # fmt: skip
    "gemini-cli": frozenset(
        {"binary", "base_url", "max_retries", "max_turns", "exclude_tools", "extra_args"}
    ),
    "opencode": frozenset({"binary", "base_url", "extra_args"}),
    "aider": frozenset(
        {"binary", "base_url", "edit_format", "map_tokens", "network_retry_limit", "extra_args"}
    ),
}


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


# coder-eval agent options evalsite does not implement: refused by name, not ignored.
UNBUILT_OPTIONS = {
    "plugins": "local Claude Code plugins",
    "claude_settings": "a Claude Code settings file",
    "setting_sources": "Claude Code setting sources",
    "system_prompt_mode": "coder-eval's system prompt modes (use system_prompt or append_system_prompt)",
    "context_window": "a context window cap",
}


def option_problems(kind: str | None, keys: list[str], inherited: bool = False) -> list[tuple[str, str]]:
    """(key, message) for each agent option no kind reads (a typo, or a coder-eval option not
    built here) and, when `kind` is given, each option of another kind. A plugin kind's options
    are its own business."""
    if kind is not None and kind not in KIND_OPTIONS:
        return []
    every = COMMON_OPTIONS.union(*KIND_OPTIONS.values())
    problems = []
    for key in keys:
        if key in UNBUILT_OPTIONS:
            problems.append(
                (key, f"coder-eval's agent option {key!r} ({UNBUILT_OPTIONS[key]}) is not built in evalsite")
            )
        elif key not in every:
            allowed = sorted(COMMON_OPTIONS | KIND_OPTIONS[kind]) if kind else sorted(every)
            close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.75)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            problems.append(
                (key, f"no agent kind has an option {key!r}{hint} (options here: {', '.join(allowed)})")
            )
        elif kind is not None and key not in COMMON_OPTIONS | KIND_OPTIONS[kind] and not inherited:
            elsewhere = sorted(name for name, options in KIND_OPTIONS.items() if key in options)
            problems.append((key, f"option {key!r} applies to {', '.join(elsewhere)}, not to {kind}"))
    return problems
