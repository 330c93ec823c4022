"""The one registry of agent kinds: a descriptor row per built-in kind (`KINDS`), plus the
installed plugins (no Django). Every other table of kinds (options, agentless, resumable,
CLIs, providers) is derived from the rows.

Adding a built-in kind: a row here and its module under `runs_app.engine.agents` (docs/agents.md).

A package adds a kind with an entry point in the ``evalsite.agents`` group, e.g. in pyproject.toml:

    [project.entry-points."evalsite.agents"]
    my-agent = "my_package.agent:MyAgent"    # an AgentKind subclass (or instance)

The task and experiment specs, the experiment form and the API read the names from here; the
engine (`runs_app.engine.agents`) turns a name into the kind's implementation. Built-in names
always win, so an installed package cannot replace them.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points

ENTRY_POINT_GROUP = "evalsite.agents"
# Every kind takes the common options (`model` too: an experiment's default model may reach a
# `none` or `oracle` variant).
COMMON_OPTIONS = frozenset({"type", "model", "env", "secrets", "prices"})


@dataclass(frozen=True)
class AgentKindInfo:
    """What the product knows of one built-in kind; its implementation is the module of the same
    name under `runs_app.engine.agents` (`claude-code`: `claude_code.py`)."""

    name: str
    # The options it reads besides COMMON_OPTIONS; any other key under `agent` is an error
    # naming the kinds it applies to.
    options: frozenset[str] = frozenset()
    # False: the kind does its work before any process would start (`none`, `oracle`).
    runs_process: bool = True
    # False: no trajectory, so criteria reading the agent's commands cannot apply (`none`).
    has_trajectory: bool = True
    # False: no tool calls to watch, so no criterion can stop it early.
    has_tool_calls: bool = True
    # Whether it can continue its session with a new message (simulated conversations).
    can_resume: bool = False
    # The model CLI it drives, the worker variable that may point to it, and how to ask its version.
    cli: str = ""
    cli_variable: str = ""
    version_args: tuple[str, ...] = ("--version",)
    # The model providers (`providers.PROVIDERS`) it calls through the gateway by default.
    providers: tuple[str, ...] = ()

    @property
    def module(self) -> str:
        return self.name.replace("-", "_")


# evalsite's: `false` sends the bare prompt, without the working-directory line coder-eval puts
# before every prompt. Only kinds that run a process read a prompt, so only they take it.
PREAMBLE_OPTION = "working_directory_preamble"
_CLI_OPTIONS = frozenset({"binary", "base_url", "extra_args", PREAMBLE_OPTION})
KINDS: dict[str, AgentKindInfo] = {
    kind.name: kind
    for kind in (
        AgentKindInfo("none", runs_process=False, has_trajectory=False, has_tool_calls=False),
        AgentKindInfo("oracle", runs_process=False, has_tool_calls=False),
        AgentKindInfo(
            "command", frozenset({"command", "script", "prompt_via", PREAMBLE_OPTION}), can_resume=True,
            providers=("anthropic", "openai"),
        ),
        AgentKindInfo(
            "claude-code",
            _CLI_OPTIONS | {
                "permission_mode", "allowed_tools", "disallowed_tools", "max_turns", "append_system_prompt",
                "system_prompt", "system_prompt_file", "include_partial_messages", "max_budget_usd",
                "max_retries", "provider", "region", "project_id",
                # coder-eval's, passed to the CLI as its SDK does (`claude_options`).
                "system_prompt_mode", "setting_sources", "plugins", "claude_settings", "context_window",
                "sdk_options",
            },
            can_resume=True, cli="claude", cli_variable="EVALSITE_CLAUDE_BIN", providers=("anthropic",),
        ),
        AgentKindInfo(
            "codex",
            _CLI_OPTIONS | {
                "sandbox", "max_retries", "request_max_retries", "stream_max_retries", "reasoning_effort",
                "network_retry_limit",
            },
            can_resume=True, cli="codex", cli_variable="EVALSITE_CODEX_BIN", providers=("openai",),
        ),
        AgentKindInfo(
            "gemini-cli", _CLI_OPTIONS | {"max_retries", "max_turns", "exclude_tools"},
            cli="gemini", cli_variable="EVALSITE_GEMINI_BIN", providers=("gemini",),
        ),
        AgentKindInfo(
            "opencode", _CLI_OPTIONS, cli="opencode", cli_variable="EVALSITE_OPENCODE_BIN",
            providers=("openai",),
        ),
        AgentKindInfo(
            "aider", _CLI_OPTIONS | {"edit_format", "map_tokens", "network_retry_limit"},
            cli="aider", cli_variable="EVALSITE_AIDER_BIN", providers=("openai",),
        ),
    )
}  # fmt: skip
# The kind a task runs when no layer names one (coder-eval's default).
DEFAULT_KIND = "claude-code"

# The tables the specs, the form and the engine read, all derived from KINDS.
BUILTIN_KINDS = tuple(KINDS)
KIND_OPTIONS = {name: kind.options for name, kind in KINDS.items()}
AGENTLESS_KINDS = tuple(name for name, kind in KINDS.items() if not kind.has_trajectory)
UNWATCHED_KINDS = tuple(name for name, kind in KINDS.items() if not kind.has_tool_calls)
RESUMABLE_KINDS = tuple(name for name, kind in KINDS.items() if kind.can_resume)


def kinds_reading(option: str) -> tuple[str, ...]:
    """The built-in kinds that read `option`."""
    return tuple(name for name, kind in KINDS.items() if option in kind.options)


def plugin_entry_points() -> dict[str, EntryPoint]:
    """Installed third-party kinds by name (a built-in name is never taken by a plugin)."""
    found: dict[str, EntryPoint] = {}
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


def option_problems(kind: str | None, keys: list[str], inherited: bool = False) -> list[tuple[str, str]]:
    """(key, message) for each agent option no kind reads (a typo) and, when `kind` is given,
    each option of another kind. A plugin kind's options
    are its own business."""
    if kind is not None and kind not in KIND_OPTIONS:
        return []
    every = COMMON_OPTIONS.union(*KIND_OPTIONS.values())
    problems = []
    for key in keys:
        if key not in every:
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
