"""The ``gemini-cli`` agent: Google's Gemini CLI, headless.

    gemini -p PROMPT -o stream-json --yolo [-m MODEL]      (stdin closed; -p "" + stdin for long prompts)

HOME holds ``.gemini/settings.json``: API-key auth (with only a base URL set the CLI picks an auth
type headless mode rejects), no folder-trust check (which would silently drop --yolo and with it
the shell tool), no usage statistics, telemetry, auto-update, IDE or checkpointing (the only calls
it makes are then to the model), ``general.maxAttempts`` from ``max_retries`` (default 2: the
CLI's own 10 with 5-30 s backoff cost minutes on a dead server) and ``model.maxSessionTurns``
from ``max_turns``. ``GEMINI_CLI_NO_RELAUNCH`` keeps it one process, so a stop reaches it.

The model is reached at GOOGLE_GEMINI_BASE_URL (the config key ``base_url``, else the worker's),
with GEMINI_API_KEY in the x-goog-api-key header. Config keys: ``model``, ``base_url``,
``max_retries``, ``max_turns``, ``exclude_tools``, ``extra_args``, ``env``, ``binary``, ``prices``.

Stream (0.61): ``init``, ``message`` (assistant text in ``delta`` chunks), ``tool_use``
(``tool_id``, ``tool_name``, ``parameters``), ``tool_result`` (``tool_id``, ``status``,
``output``), ``error`` (``severity: warning`` goes on), and a last ``result`` with ``stats``
(``input_tokens`` includes cached ones; thinking tokens are ``total - input - output``). The
exit code of an HTTP failure is its status mod 256, so the result line classifies the end.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from experiments_app.specs.agent_kinds import KINDS
from experiments_app.specs.providers import PROVIDERS
from runs_app.engine.usage import Usage, estimate_cost, model_prices

from .base import (
    AgentEvent,
    AgentInvocation,
    AgentKind,
    BaseParser,
    clip,
    mapping,
    prompt_fits_argv,
    require_cli,
)

API_KEY = PROVIDERS["gemini"].key_variable
BASE_URL = "GOOGLE_GEMINI_BASE_URL"
# The shell tool's name as criteria see it: Claude Code's, as for Codex, so `tool_name: Bash`
# matches every CLI's shell commands.
SHELL_TOOL, CLI_SHELL_TOOL = "Bash", "run_shell_command"
DEFAULT_MAX_ATTEMPTS = 2
# The CLI's own names for failures, as the evalsite error categories.
ERROR_CATEGORIES = {"FatalTurnLimitedError": "max_turns"}


class GeminiCliAgent(AgentKind):
    info = KINDS["gemini-cli"]
    name = info.name
    needs_final_line = True

    def prepare(
        self, prompt: str, workspace: Path, home: Path, config: Mapping[str, Any], secrets: Mapping[str, str]
    ) -> AgentInvocation:
        binary = require_cli(self.info, API_KEY, config, secrets)
        on_argv = prompt_fits_argv(prompt)
        # -p "" with the prompt on stdin: the CLI appends stdin to -p's text.
        argv = [binary, "-p", prompt if on_argv else "", "-o", "stream-json", "--yolo"]
        if config.get("model"):
            argv += ["-m", str(config["model"])]
        argv += [str(arg) for arg in config.get("extra_args") or []]
        env = {str(k): str(v) for k, v in (config.get("env") or {}).items()}
        env["GEMINI_CLI_NO_RELAUNCH"] = "true"
        env["GEMINI_CLI_HOME"] = str(home)
        if config.get("base_url") or secrets.get(BASE_URL):
            env[BASE_URL] = str(config.get("base_url") or secrets[BASE_URL]).rstrip("/")
        return AgentInvocation(
            argv=argv,
            stdin=b"" if on_argv else prompt.encode(),
            env_extra=env,
            secrets_needed=[API_KEY],
            files_to_write={str(home / ".gemini" / "settings.json"): settings_json(config).encode()},
        )

    def parser(self, config: Mapping[str, Any] | None = None) -> GeminiStreamParser:
        return GeminiStreamParser(prices=(config or {}).get("prices"))


def settings_json(config: Mapping[str, Any]) -> str:
    settings: dict[str, Any] = {
        "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False, "logPrompts": False},
        "general": {
            "enableAutoUpdate": False,
            "enableAutoUpdateNotification": False,
            "checkpointing": {"enabled": False},
            "maxAttempts": int(config.get("max_retries", DEFAULT_MAX_ATTEMPTS - 1)) + 1,
        },
        "ide": {"enabled": False},
    }
    if config.get("max_turns"):
        settings["model"] = {"maxSessionTurns": int(config["max_turns"])}
    if config.get("exclude_tools"):
        settings["tools"] = {"exclude": [str(tool) for tool in config["exclude_tools"]]}
    return json.dumps(settings, indent=2) + "\n"


class GeminiStreamParser(BaseParser):
    def __init__(self, prices: Mapping[str, float] | None = None) -> None:
        super().__init__()
        self.prices = dict(prices) if prices else None
        self.model = ""
        self.session_id = ""
        self._reply: list[str] = []
        # Model calls, as the stream shows them: a reply (text and tool calls) after the last
        # tool result is a new call. The stats carry no count; the gateway counts them exactly.
        self.rounds = 0
        self._in_round = False

    def _parse(self, obj: dict[str, Any]) -> list[AgentEvent] | None:
        kind = obj.get("type")
        if kind == "init":
            self.model, self.session_id = str(obj.get("model") or ""), str(obj.get("session_id") or "")
            return [
                AgentEvent("system", {"subtype": "init", "model": self.model, "session_id": self.session_id})
            ]
        if kind == "message":
            return self._message(obj)
        if kind == "tool_use":
            self._enter_round()
            self._reply = []
            tool_input = mapping(obj.get("parameters"))
            name = str(obj.get("tool_name") or "")
            event = self._add_tool_call(
                str(obj.get("tool_id") or ""), SHELL_TOOL if name == CLI_SHELL_TOOL else name, tool_input
            )
            return [event] if event else []
        if kind == "tool_result":
            return self._tool_result(obj)
        if kind == "error":
            text = str(obj.get("message") or "")
            if obj.get("severity") == "warning":
                return [AgentEvent("system", {"subtype": "warning", "text": text})]
            self.error, self.error_category = text or "the Gemini CLI reported an error", "agent_error"
            return [AgentEvent("error", {"message": self.error, "category": self.error_category})]
        if kind == "result":
            return self._result(obj)
        return []

    def _message(self, obj: dict[str, Any]) -> list[AgentEvent]:
        if obj.get("role") != "assistant":
            return []
        chunk = str(obj.get("content") or "")
        self._enter_round()
        self._reply.append(chunk)
        self.final_text = "".join(self._reply)
        return [AgentEvent("message", {"text": chunk, "delta": bool(obj.get("delta"))})]

    def _enter_round(self) -> None:
        if not self._in_round:
            self.rounds += 1
            self._in_round = True

    def _tool_result(self, obj: dict[str, Any]) -> list[AgentEvent]:
        self._in_round = False
        call_id = str(obj.get("tool_id") or "")
        call = self._calls_by_id.get(call_id)
        failed = obj.get("status") != "success"
        output = clip(str(obj.get("output") or (obj.get("error") or {}).get("message") or ""))
        if call is not None:
            call["status"], call["output"] = ("error" if failed else "success"), output
        name = call["name"] if call else ""
        return [
            AgentEvent("tool_result", {"id": call_id, "name": name, "is_error": failed, "output": output})
        ]

    def _result(self, obj: dict[str, Any]) -> list[AgentEvent]:
        self.finished = True
        stats = mapping(obj.get("stats"))
        self.usage = _usage(stats, self.rounds, self.prices or model_prices(self.model))
        events = [self._usage_event()]
        if obj.get("status") != "success":
            error = mapping(obj.get("error"))
            self.error = str(error.get("message") or "the Gemini CLI ended with an error")
            self.error_category = ERROR_CATEGORIES.get(str(error.get("type")), _category(self.error))
            events.append(AgentEvent("error", {"message": self.error, "category": self.error_category}))
        return events


def _usage(stats: Mapping[str, Any], turns: int, prices: Mapping[str, float] | None) -> Usage:
    def number(key: str) -> int:
        value = stats.get(key)
        return value if isinstance(value, int) and value > 0 else 0

    cached = number("cached")
    usage = Usage(
        input_tokens=max(0, number("input_tokens") - cached),
        cache_read_tokens=cached,
        # thinking tokens are billed as output; the CLI leaves them out of output_tokens
        output_tokens=max(number("output_tokens"), number("total_tokens") - number("input_tokens")),
        turns=turns,
    )
    usage.reasoning_tokens = usage.output_tokens - number("output_tokens")
    if prices:
        usage.cost_usd = estimate_cost(usage, prices)
    return usage


def _category(message: str) -> str:
    lowered = message.lower()
    if "401" in message or "403" in message or "api key" in lowered or "unauthenticated" in lowered:
        return "auth"
    if "429" in message or "quota" in lowered or "rate" in lowered:
        return "rate_limit"
    return "api_error"
