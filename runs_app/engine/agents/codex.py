"""The ``codex`` agent: the real Codex CLI, run as users run it.

    codex exec --json --skip-git-repo-check --sandbox workspace-write [-m MODEL] PROMPT   (stdin closed)

CODEX_HOME is ``<sandbox home>/.codex`` with a generated ``config.toml``: one model provider
``evalsite`` whose ``base_url`` comes from the config key ``base_url``, else OPENAI_BASE_URL from the
worker (Codex itself ignores that variable), else the public OpenAI endpoint.

Config keys: ``model``, ``sandbox`` (default workspace-write), ``base_url``, ``max_retries`` (sets
both of the next two), ``request_max_retries``, ``stream_max_retries``, ``reasoning_effort``,
``network_retry_limit`` (default 3, see below), ``extra_args``, ``env``, ``binary``, ``prices``
(USD per MTok: input/output/cache_read, for a cost estimate: the stream carries no cost).

Stream notes (FORMATS.md): usage comes only on ``turn.completed`` (summed over the turn's model
calls, input including cached tokens); commands are shell-wrapped (``/bin/bash -lc "..."``).
Codex never exits while its server is unreachable ("Reconnecting... waiting for network" every
<= 60 s), so after ``network_retry_limit`` such notices the parser sets ``fatal`` for the runner.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from experiments_app.specs.agent_kinds import KINDS
from experiments_app.specs.providers import PROVIDERS
from runs_app.engine.usage import estimate_cost

from .base import (
    AgentEvent,
    AgentInvocation,
    AgentKind,
    AgentSetupError,
    BaseParser,
    clip,
    prompt_fits_argv,
    require_cli,
)

API_KEY = PROVIDERS["openai"].key_variable
DEFAULT_BASE_URL = "https://api.openai.com/v1"
PROVIDER = "evalsite"
# The tool name given to shell commands, the same as Claude Code's, so a `command_executed`
# criterion with tool_name Bash works for both CLIs.
SHELL_TOOL = "Bash"
PATCH_TOOL = "apply_patch"
TOOL_ITEMS = ("command_execution", "file_change", "mcp_tool_call", "web_search")


class CodexAgent(AgentKind):
    info = KINDS["codex"]
    name = info.name
    needs_final_line = True

    def prepare(
        self, prompt: str, workspace: Path, home: Path, config: Mapping[str, Any], secrets: Mapping[str, str]
    ) -> AgentInvocation:
        return self._invocation(prompt, None, home, config, secrets)

    def resume(
        self,
        prompt: str,
        session: str,
        workspace: Path,
        home: Path,
        config: Mapping[str, Any],
        secrets: Mapping[str, str],
    ) -> AgentInvocation:
        if not session:
            raise AgentSetupError("codex: the last turn reported no thread_id to resume")
        return self._invocation(prompt, session, home, config, secrets)

    def _invocation(
        self,
        prompt: str,
        session: str | None,
        home: Path,
        config: Mapping[str, Any],
        secrets: Mapping[str, str],
    ) -> AgentInvocation:
        """`codex exec`, or `codex exec resume SESSION` (which takes the sandbox as a config value:
        it has no --sandbox option)."""
        binary = require_cli(self.info, API_KEY, config, secrets)
        sandbox = str(config.get("sandbox") or "workspace-write")
        if session is None:
            argv = [binary, "exec", "--json", "--skip-git-repo-check", "--sandbox", sandbox]
        else:
            argv = [binary, "exec", "resume", "--json", "--skip-git-repo-check"]
            argv += ["-c", f'sandbox_mode="{sandbox}"']
        if config.get("model"):
            argv += ["-m", str(config["model"])]
        argv += [str(arg) for arg in config.get("extra_args") or []]
        if session is not None:
            argv.append(session)
        on_argv = prompt_fits_argv(prompt)
        # "-" makes Codex read the prompt from stdin; otherwise stdin must be closed at once:
        # `codex exec` reads a non-TTY stdin to EOF before it starts.
        argv.append(prompt if on_argv else "-")
        codex_home = home / ".codex"
        env = {str(k): str(v) for k, v in (config.get("env") or {}).items()}
        env["CODEX_HOME"] = str(codex_home)
        return AgentInvocation(
            argv=argv,
            stdin=b"" if on_argv else prompt.encode(),
            env_extra=env,
            secrets_needed=[API_KEY],
            files_to_write={str(codex_home / "config.toml"): codex_config(config, secrets).encode()},
        )

    def parser(self, config: Mapping[str, Any] | None = None) -> CodexStreamParser:
        config = config or {}
        return CodexStreamParser(
            network_retry_limit=int(config.get("network_retry_limit", 3)), prices=config.get("prices")
        )


def codex_config(config: Mapping[str, Any], secrets: Mapping[str, str]) -> str:
    """The config.toml text. TOML basic strings accept JSON string escapes, hence json.dumps."""
    base_url = config.get("base_url") or secrets.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
    top = {"approval_policy": "never", "check_for_update_on_startup": False, "model_provider": PROVIDER}
    if config.get("model"):
        top["model"] = str(config["model"])
    if config.get("reasoning_effort"):
        top["model_reasoning_effort"] = str(config["reasoning_effort"])
    provider: dict[str, Any] = {
        "name": "evalsite model server",
        "base_url": str(base_url).rstrip("/"),  # Codex POSTs {base_url}/responses
        "env_key": API_KEY,
        "wire_api": "responses",  # "chat" is rejected by Codex 0.171 at config load
        "supports_websockets": False,  # plain HTTP SSE; no WebSocket attempts first
    }
    for key in ("request_max_retries", "stream_max_retries"):
        value = config.get(key, config.get("max_retries"))
        if value is not None:
            provider[key] = int(value)
    lines = [f"{key} = {_toml(value)}" for key, value in top.items()]
    lines += ["", f"[model_providers.{PROVIDER}]"]
    lines += [f"{key} = {_toml(value)}" for key, value in provider.items()]
    return "\n".join(lines) + "\n"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(str(value))


def unwrap_shell(command: str) -> str:
    """``/bin/bash -lc "sed ..."`` -> ``sed ...``: criteria match what the model asked to run."""
    try:
        parts = shlex.split(command)
    except ValueError:
        return command
    if len(parts) == 3 and parts[0].rsplit("/", 1)[-1] in ("bash", "sh", "zsh") and parts[1] in ("-lc", "-c"):
        return parts[2]
    return command


class CodexStreamParser(BaseParser):
    """Parses ``codex exec --json`` lines."""

    def __init__(self, network_retry_limit: int = 3, prices: Mapping[str, float] | None = None) -> None:
        super().__init__()
        self.network_retry_limit = network_retry_limit
        self.prices = dict(prices) if prices else None
        self.thread_id = ""
        self.retry_notices: list[str] = []
        self.network_waits = 0
        self._tool_items = 0
        self._turns_completed = 0

    def _parse(self, obj: dict[str, Any]) -> list[AgentEvent] | None:
        kind = obj.get("type")
        if kind == "thread.started":
            self.thread_id = str(obj.get("thread_id") or "")
            self.session_id = self.thread_id
            return [AgentEvent("system", {"subtype": "thread.started", "thread_id": self.thread_id})]
        if kind == "turn.started":
            return [AgentEvent("system", {"subtype": "turn.started"})]
        if kind in ("item.started", "item.updated", "item.completed"):
            return self._item(obj.get("item") or {}, done=kind == "item.completed")
        if kind == "turn.completed":
            return self._turn_completed(obj.get("usage") or {})
        if kind == "turn.failed":
            self.finished = True
            self.error = str((obj.get("error") or {}).get("message") or "the Codex turn failed")
            self.error_category = _category(self.error)
            return [AgentEvent("error", {"message": self.error, "category": self.error_category})]
        if kind == "error":
            return self._error(str(obj.get("message") or ""))
        return []

    def _item(self, item: dict[str, Any], *, done: bool) -> list[AgentEvent]:
        item_type = item.get("type")
        if item_type in TOOL_ITEMS:
            return self._tool_item(item, done=done)
        if not done:
            return []
        if item_type == "agent_message":
            self.final_text = str(item.get("text") or "")
            return [AgentEvent("message", {"text": self.final_text})]
        if item_type == "reasoning":
            return [AgentEvent("message", {"text": str(item.get("text") or ""), "reasoning": True})]
        if item_type == "error":
            # e.g. "Falling back from WebSockets to HTTPS transport": a warning, the run goes on.
            return [AgentEvent("system", {"subtype": "warning", "message": item.get("message")})]
        return [AgentEvent("system", {"subtype": f"item:{item_type}"})]

    def _tool_item(self, item: dict[str, Any], *, done: bool) -> list[AgentEvent]:
        call_id = str(item.get("id") or "")
        name, tool_input = _tool_call(item)
        events = []
        event = self._add_tool_call(call_id, name, tool_input)
        if event:
            events.append(event)
        if not done:
            return events
        call = self._calls_by_id[call_id]
        if call["status"] != "pending":
            return events  # a repeated item.completed
        failed = item.get("status") == "failed" or item.get("exit_code") not in (None, 0)
        call["status"] = "error" if failed else "success"
        call["output"] = clip(str(item.get("aggregated_output") or ""))
        if item.get("exit_code") is not None:
            call["exit_code"] = item["exit_code"]
        # Each tool result goes back to the model, so it starts one more model call: a turn.
        self._tool_items += 1
        self._update_turns()
        events.append(
            AgentEvent(
                "tool_result", {"id": call_id, "name": name, "is_error": failed, "output": call["output"]}
            )
        )
        return events

    def _turn_completed(self, usage: Mapping[str, Any]) -> list[AgentEvent]:
        self.finished = True
        self._turns_completed += 1
        cached = _int(usage.get("cached_input_tokens"))
        # Codex's input_tokens include the cached ones; keep them apart, like Anthropic's numbers.
        self.usage.input_tokens += max(0, _int(usage.get("input_tokens")) - cached)
        self.usage.cache_read_tokens += cached
        self.usage.cache_creation_tokens += _int(usage.get("cache_write_input_tokens"))
        self.usage.output_tokens += _int(usage.get("output_tokens"))
        self.usage.reasoning_tokens += _int(usage.get("reasoning_output_tokens"))
        self._update_turns()
        if self.prices:
            self.usage.cost_usd = estimate_cost(self.usage, self.prices)
        return [self._usage_event()]

    def _update_turns(self) -> None:
        """Estimate of model calls (the stream has no count): one per tool result plus one per turn's
        final answer. Parallel tool calls make it high; sandbox-denied commands, which Codex leaves
        out of the stream, make it low."""
        self.usage.turns = self._tool_items + self._turns_completed

    def _error(self, message: str) -> list[AgentEvent]:
        if not message.startswith("Reconnecting..."):
            # The fatal message comes just before turn.failed; keep it in case the stream stops here.
            self.error = message
            self.error_category = _category(message)
            return [AgentEvent("error", {"message": message, "category": self.error_category})]
        self.retry_notices.append(message)
        if "waiting for network" in message:
            self.network_waits += 1
            if self.network_waits >= self.network_retry_limit and not self.fatal:
                self.fatal = (
                    f"Codex cannot reach its model server ({self.network_waits} reconnect attempts: "
                    f"{message}); check base_url / OPENAI_BASE_URL and that the server is up"
                )
                self.fatal_category = "connection"
        return [AgentEvent("system", {"subtype": "retry", "message": message})]


def _tool_call(item: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    item_type = item.get("type")
    if item_type == "command_execution":
        raw = str(item.get("command") or "")
        return SHELL_TOOL, {"command": unwrap_shell(raw), "raw_command": raw}
    if item_type == "file_change":
        return PATCH_TOOL, {"changes": item.get("changes") or []}
    if item_type == "mcp_tool_call":
        return f"mcp:{item.get('server')}/{item.get('tool')}", {"arguments": item.get("arguments")}
    return "WebSearch", {"query": item.get("query")}


def _category(message: str) -> str:
    lowered = message.lower()
    if any(word in lowered for word in ("401", "unauthorized", "api key", "authentication")):
        return "auth"
    if any(word in lowered for word in ("429", "rate limit", "too many requests", "quota")):
        return "rate_limit"
    if "context window" in lowered or "context_length" in lowered:
        return "prompt_too_long"
    if "waiting for network" in lowered or "connection failed" in lowered:
        return "connection"
    # Codex replaces an HTTP 500 body with "We're currently experiencing high demand ...".
    return "api_error"


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
