"""The Claude Code options coder-eval 0.12.16 passes to the CLI through its SDK, checked (no Django).

`problems(options)` names every option value the `claude-code` kind cannot pass on as coder-eval
does: the loader refuses them at import, the agent module at launch (`prepare`). What each option
becomes on the command line is the agent module's (`runs_app.engine.agents.claude_code`):

- `system_prompt_mode`: `append` (default) gives `--append-system-prompt` and
  `--exclude-dynamic-system-prompt-sections` (the SDK preset's); `replace` gives `--system-prompt`;
- `setting_sources`: `--setting-sources=project` by default, or the list given (`[]`: none);
- `plugins`: `--plugin-dir <folder>` each (a folder of the task's bundle, mounted read-only);
- `claude_settings`: `--settings <json>` for a mapping, `--settings <text>` for a string (a path
  the CLI reads from the workspace, or JSON);
- `context_window`: `CLAUDE_CODE_AUTO_COMPACT_WINDOW`;
- `sdk_options`: each key as the SDK maps it (`SDK_FLAGS`, `SDK_ENV`); the keys the CLI cannot take
  are refused (`SDK_REFUSED`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

SETTING_SOURCES = ("user", "project", "local")
DEFAULT_SETTING_SOURCES = ["project"]
SYSTEM_PROMPT_MODES = ("append", "replace")
CONTEXT_WINDOW = (100_000, 1_000_000)  # the CLI drops an auto-compact window outside this range
EFFORTS = ("low", "medium", "high", "xhigh", "max")
# coder-eval's folder token: the task's own folder (where relative paths start anyway).
TASK_DIR_PREFIX = "$TASK_DIR/"

# sdk_options keys (ClaudeAgentOptions fields coder-eval lets a task set) that the SDK turns into
# a command-line flag or an environment variable of the CLI.
SDK_FLAGS = (
    "effort", "fallback_model", "betas", "thinking", "max_thinking_tokens", "output_format",
    "include_hook_events", "strict_mcp_config",
)  # fmt: skip
SDK_ENV = {
    "enable_file_checkpointing": "CLAUDE_CODE_ENABLE_SDK_FILE_CHECKPOINTING",
    "client_app": "CLAUDE_AGENT_SDK_CLIENT_APP",
}
# Keys the SDK uses itself (its control protocol, its reader, how it starts the process): `claude -p`
# has nothing they could reach.
SDK_REFUSED = {
    "forward_subagent_text": "is asked of the CLI over the SDK's control protocol, which `claude -p` "
    "does not speak",
    "verbatim_prompts": "marks the SDK's stream-json input messages; evalsite passes the prompt with -p",
    "load_timeout_ms": "bounds the SDK's session-store reads, and no task can set a session store",
    "max_buffer_size": "sizes the SDK's own reader of the CLI's output (evalsite's parser has its own limit)",
    "user": "names the OS user the SDK starts the CLI as; the sandbox decides the user",
    "resume_session_at": "picks where a resumed session restarts; evalsite resumes only simulated "
    "conversations, each from its last turn",
    "resume_drops_turn": "picks where a resumed session restarts; evalsite resumes only simulated "
    "conversations, each from its last turn",
}
# ClaudeAgentOptions fields coder-eval owns itself (a top-level agent option, or the harness's).
SDK_FRAMEWORK_OWNED = frozenset({
    "model", "permission_mode", "allowed_tools", "disallowed_tools", "plugins", "system_prompt",
    "system_prompt_file", "settings", "cwd", "env", "stderr", "debug_stderr", "resume", "max_turns",
    "session_id", "session_store", "session_store_flush", "continue_conversation", "fork_session",
    "max_budget_usd", "task_budget", "hooks", "mcp_servers", "cli_path", "extra_args", "agents",
    "can_use_tool", "permission_prompt_tool_name", "tools", "sandbox", "skills", "add_dirs",
    "setting_sources", "include_partial_messages",
})  # fmt: skip

Problem = tuple[tuple[str | int, ...], str]


def problems(options: Mapping[str, Any], *, resolved: bool = False, placed: bool = False) -> list[Problem]:
    """Each value of the six options that cannot reach the CLI as coder-eval passes it. With
    `resolved` (a whole trial's agent, every layer merged) the cross-option rules apply too;
    `placed`: the runner has put each plugin's folder on the worker (an absolute path)."""
    found: list[Problem] = []
    mode = options.get("system_prompt_mode")
    if mode is not None and mode not in SYSTEM_PROMPT_MODES:
        found.append((("system_prompt_mode",), f"must be append or replace, not {mode!r}"))
    sources = options.get("setting_sources")
    if sources is not None and (
        not isinstance(sources, list) or any(source not in SETTING_SOURCES for source in sources)
    ):
        found.append(
            (("setting_sources",), f"must be a list of {', '.join(SETTING_SOURCES)} (or [] for none)")
        )
    found += _plugin_problems(options.get("plugins"), placed)
    found += _settings_problems(options.get("claude_settings"), options.get("context_window"))
    found += _sdk_problems(options.get("sdk_options"))
    if resolved:
        found += _prompt_problems(options)
    return found


def _plugin_problems(plugins: Any, placed: bool) -> list[Problem]:
    if plugins is None:
        return []
    if not isinstance(plugins, list):
        return [(("plugins",), "must be a list of {type: local, path: <folder>}")]
    found: list[Problem] = []
    for index, plugin in enumerate(plugins):
        if (
            not isinstance(plugin, dict)
            or plugin.get("type") != "local"
            or not isinstance(plugin.get("path"), str)
        ):
            found.append((("plugins", index), "must be {type: local, path: <folder>} (local plugins only)"))
            continue
        if extra := sorted(set(plugin) - {"type", "path"}):
            found.append(
                (("plugins", index), f"unknown key(s) {', '.join(extra)}: a plugin has type and path")
            )
        path = plugin_path(plugin["path"])
        if placed and not os.path.isabs(path):
            found.append((("plugins", index, "path"), f"{path!r} was not placed on the worker by the runner"))
        elif not placed and ("$" in path or path.startswith(("/", "~"))):
            found.append(
                (
                    ("plugins", index, "path"),
                    f"{plugin['path']!r}: give the plugin's folder relative to the YAML's folder; it travels "
                    "in the task's bundle (environment variables and host paths do not reach a worker)",
                )
            )
    return found


def plugin_path(path: str) -> str:
    """A plugin's folder relative to the YAML's folder ($TASK_DIR/ says the same)."""
    return path[len(TASK_DIR_PREFIX) :] if path.startswith(TASK_DIR_PREFIX) else path


def _settings_problems(settings: Any, context_window: Any) -> list[Problem]:
    found: list[Problem] = []
    if settings is not None:
        if isinstance(settings, dict):
            try:
                json.dumps(settings)
            except (TypeError, ValueError):
                found.append((("claude_settings",), "must be a mapping JSON can hold"))
            if context_window is not None and "autoCompactWindow" in settings:
                found.append(
                    (
                        ("claude_settings", "autoCompactWindow"),
                        "context_window and claude_settings.autoCompactWindow both set the auto-compact "
                        "window: set only context_window",
                    )
                )
        elif not isinstance(settings, str) or not settings.strip():
            found.append((("claude_settings",), "must be a mapping, or a settings file's path or JSON text"))
        elif not settings.lstrip().startswith("{") and os.path.isabs(settings):
            found.append(
                (
                    ("claude_settings",),
                    f"{settings!r} is a path of the machine that wrote the task: give a path in the "
                    "workspace "
                    "(the CLI reads it from there), or the settings themselves as a mapping",
                )
            )
    if context_window is not None:
        low, high = CONTEXT_WINDOW
        if (
            isinstance(context_window, bool)
            or not isinstance(context_window, int)
            or not low <= context_window <= high
        ):
            found.append(
                (("context_window",), f"must be an integer from {low} to {high} tokens for claude-code")
            )
    return found


def _sdk_problems(sdk: Any) -> list[Problem]:
    if sdk is None:
        return []
    if not isinstance(sdk, dict):
        return [(("sdk_options",), "must be a mapping of ClaudeAgentOptions fields")]
    found: list[Problem] = []
    known = (*SDK_FLAGS, *SDK_ENV, *SDK_REFUSED)
    for key, value in sdk.items():
        where = ("sdk_options", key)
        if key in SDK_FRAMEWORK_OWNED:
            found.append(
                (where, f"{key!r} is the harness's (coder-eval refuses it too): set the agent option instead")
            )
        elif key in SDK_REFUSED:
            found.append((where, f"{key!r} cannot reach the Claude Code CLI: it {SDK_REFUSED[key]}"))
        elif key not in known:
            found.append(
                (where, f"{key!r} is not a ClaudeAgentOptions field (known: {', '.join(sorted(known))})")
            )
        elif problem := _sdk_value_problem(key, value):
            found.append((where, problem))
    return found


def _sdk_value_problem(key: str, value: Any) -> str | None:
    if key == "effort" and value is not None and value not in EFFORTS:
        return f"must be one of {', '.join(EFFORTS)}"
    if key in ("fallback_model", "client_app") and value is not None and not isinstance(value, str):
        return "must be a string"
    if key == "betas" and not (isinstance(value, list) and all(isinstance(beta, str) for beta in value)):
        return "must be a list of beta names"
    if (
        key == "max_thinking_tokens"
        and value is not None
        and (isinstance(value, bool) or not isinstance(value, int))
    ):
        return "must be an integer"
    if key in ("include_hook_events", "strict_mcp_config", "enable_file_checkpointing") and not isinstance(
        value, bool
    ):
        return "must be true or false"
    if key == "thinking" and value is not None and not _thinking_ok(value):
        return (
            "must be {type: adaptive}, {type: enabled, budget_tokens: N} or {type: disabled} "
            "(and an optional display)"
        )
    if (
        key == "output_format"
        and value is not None
        and not (
            isinstance(value, dict)
            and value.get("type") == "json_schema"
            and isinstance(value.get("schema"), dict)
        )
    ):
        return "must be {type: json_schema, schema: {...}}"
    return None


def _thinking_ok(value: Any) -> bool:
    if not isinstance(value, dict) or value.get("type") not in ("adaptive", "enabled", "disabled"):
        return False
    if value["type"] == "enabled" and (
        isinstance(value.get("budget_tokens"), bool) or not isinstance(value.get("budget_tokens"), int)
    ):
        return False
    return "display" not in value or isinstance(value["display"], str)


def _prompt_problems(options: Mapping[str, Any]) -> list[Problem]:
    mode = options.get("system_prompt_mode") or "append"
    prompt = options.get("system_prompt")
    has_prompt = (isinstance(prompt, str) and prompt.strip()) or options.get("system_prompt_file")
    if mode == "replace" and not has_prompt:
        return [
            (
                ("system_prompt_mode",),
                "replace needs system_prompt (or system_prompt_file): there is no prompt to replace Claude "
                "Code's default with",
            )
        ]
    if mode == "append" and has_prompt and options.get("append_system_prompt"):
        return [
            (
                ("append_system_prompt",),
                "system_prompt is appended to Claude Code's prompt already (system_prompt_mode: append): put "
                "the text in one of the two",
            )
        ]
    return []
