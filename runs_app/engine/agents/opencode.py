"""The ``opencode`` agent: the opencode CLI, headless.

    opencode run --format json --title evalsite -m evalsite/MODEL PROMPT      (stdin closed)

Its configuration (OPENCODE_CONFIG, written in HOME) defines one provider ``evalsite`` on the
OpenAI-compatible Chat Completions API, whose ``baseURL`` is the config key ``base_url`` (else
the worker's OPENAI_BASE_URL; through the gateway, its URL), with ``permission: allow`` (``run``
rejects every "ask"), no auto-update, sharing, LSP, formatters, plugins or snapshots. The XDG
folders live in HOME; the config folder is pre-seeded with the plugin package opencode would
otherwise install from npm at every start. ``--title`` saves the title-generating model call.
OPENCODE_DISABLE_* switch off the models.dev fetch, the project's own config (a task's
``opencode.json`` must not change the harness's) and the rest (see ENV).

Config keys: ``model`` (default gpt-5.5), ``base_url``, ``extra_args``, ``env``, ``binary``,
``prices`` (USD per MTok, also given to opencode for its own cost figure).

Stream (1.18): ``step_start``; ``text``; ``tool_use`` once the tool has run, with its input,
output and status (a command's exit code in ``metadata.exit``); ``step_finish`` per model call
with tokens (``input`` excludes cached ones, ``output`` excludes reasoning) and cost; ``error``.
There is no last line: a ``step_finish`` that is not ``tool-calls`` ends the run. Its step cap is
soft, so turns are capped by the gateway (run_limits.max_turns).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from experiments_app.specs.agent_kinds import KINDS
from experiments_app.specs.providers import PROVIDERS
from runs_app.engine.usage import estimate_cost, model_prices

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

API_KEY = PROVIDERS["openai"].key_variable
DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_MODEL = "gpt-5.5"
PROVIDER = "evalsite"
# opencode's tools under Claude Code's names, so criteria (`tool_name: Bash`) read every CLI alike.
TOOL_NAMES = {
    "bash": "Bash",
    "edit": "Edit",
    "write": "Write",
    "read": "Read",
    "glob": "Glob",
    "grep": "Grep",
}
ENV = {
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "OPENCODE_DISABLE_CLAUDE_CODE": "1",
    "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1",
    "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
    "OPENCODE_DISABLE_FFF": "1",  # else a 5.5 MB library is unpacked into TMPDIR each run
    "TERM": "dumb",
}
PLUGIN = "@opencode-ai/plugin"


class OpencodeAgent(AgentKind):
    info = KINDS["opencode"]
    name = info.name
    needs_final_line = True

    def prepare(
        self, prompt: str, workspace: Path, home: Path, config: Mapping[str, Any], secrets: Mapping[str, str]
    ) -> AgentInvocation:
        binary = require_cli(self.info, API_KEY, config, secrets)
        model = str(config.get("model") or DEFAULT_MODEL)
        on_argv = prompt_fits_argv(prompt)
        argv = [binary, "run", "--format", "json", "--title", "evalsite", "-m", f"{PROVIDER}/{model}"]
        argv += [str(arg) for arg in config.get("extra_args") or []]
        if on_argv:
            argv.append(prompt)
        env = {str(k): str(v) for k, v in (config.get("env") or {}).items()}
        xdg = {name: home / folder for name, folder in XDG.items()}
        env |= {
            **ENV,
            **{name: str(path) for name, path in xdg.items()},
            "OPENCODE_CONFIG": str(home / "opencode.json"),
        }
        seeded = xdg["XDG_CONFIG_HOME"] / "opencode"
        files = {
            str(home / "opencode.json"): opencode_config(config, secrets, model).encode(),
            str(seeded / "package.json"): json.dumps({"dependencies": {PLUGIN: "*"}}).encode(),
            str(seeded / "package-lock.json"): json.dumps(
                {"lockfileVersion": 3, "packages": {"": {"dependencies": {PLUGIN: "*"}}}}
            ).encode(),
            str(seeded / "node_modules" / ".keep"): b"",
        }
        return AgentInvocation(
            argv=argv,
            stdin=b"" if on_argv else prompt.encode(),
            env_extra=env,
            secrets_needed=[API_KEY],
            files_to_write=files,
        )

    def parser(self, config: Mapping[str, Any] | None = None) -> OpencodeStreamParser:
        config = config or {}
        return OpencodeStreamParser(
            prices=config.get("prices"), model=str(config.get("model") or DEFAULT_MODEL)
        )


XDG = {"XDG_CONFIG_HOME": ".config", "XDG_DATA_HOME": ".local/share", "XDG_CACHE_HOME": ".cache",
       "XDG_STATE_HOME": ".local/state"}  # fmt: skip


def opencode_config(config: Mapping[str, Any], secrets: Mapping[str, str], model: str) -> str:
    base_url = config.get("base_url") or secrets.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
    prices = config.get("prices") or model_prices(model) or {}
    entry: dict[str, Any] = {
        "name": model,
        "tool_call": True,
        "limit": {"context": 200_000, "output": 32_000},
    }
    if prices:
        entry["cost"] = {
            "input": prices.get("input", 0.0),
            "output": prices.get("output", 0.0),
            "cache_read": prices.get("cache_read", 0.0),
            "cache_write": prices.get("cache_write", 0.0),
        }
    document = {
        "$schema": "https://opencode.ai/config.json",
        "model": f"{PROVIDER}/{model}",
        "small_model": f"{PROVIDER}/{model}",
        "enabled_providers": [PROVIDER],
        "autoupdate": False,
        "share": "disabled",
        "snapshot": False,
        "lsp": False,
        "formatter": False,
        "plugin": [],
        "permission": "allow",
        "provider": {
            PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "evalsite model server",
                "options": {
                    "baseURL": str(base_url).rstrip("/"),
                    "apiKey": "{env:OPENAI_API_KEY}",
                    # The defaults (300 s each, 6 tries) wait half an hour on a hung server.
                    "headerTimeout": 120_000,
                    "chunkTimeout": 120_000,
                },
                "models": {model: entry},
            }
        },
    }
    return json.dumps(document, indent=2) + "\n"


class OpencodeStreamParser(BaseParser):
    def __init__(self, prices: Mapping[str, float] | None = None, model: str = "") -> None:
        super().__init__()
        self.prices = dict(prices) if prices else model_prices(model)
        self.session_id = ""

    def _parse(self, obj: dict[str, Any]) -> list[AgentEvent] | None:
        kind = obj.get("type")
        part = mapping(obj.get("part"))
        self.session_id = str(obj.get("sessionID") or self.session_id)
        if kind == "text":
            self.final_text = str(part.get("text") or "")
            return [AgentEvent("message", {"text": self.final_text})]
        if kind == "reasoning":
            return [AgentEvent("message", {"text": str(part.get("text") or ""), "thinking": True})]
        if kind == "tool_use":
            return self._tool(part)
        if kind == "step_finish":
            return self._step(part)
        if kind == "error":
            return self._error(mapping(obj.get("error")))
        return []

    def _tool(self, part: dict[str, Any]) -> list[AgentEvent]:
        state = mapping(part.get("state"))
        tool_input = mapping(state.get("input"))
        name = str(part.get("tool") or "")
        call_id = str(part.get("callID") or part.get("id") or "")
        events = [e for e in [self._add_tool_call(call_id, TOOL_NAMES.get(name, name), tool_input)] if e]
        exit_code = (
            (state.get("metadata") or {}).get("exit") if isinstance(state.get("metadata"), dict) else None
        )
        failed = state.get("status") != "completed" or (isinstance(exit_code, int) and exit_code != 0)
        output = clip(
            str(state.get("output") if state.get("output") is not None else state.get("error") or "")
        )
        call = self._calls_by_id.get(call_id)
        if call is not None:
            call["status"], call["output"] = ("error" if failed else "success"), output
        events.append(
            AgentEvent(
                "tool_result",
                {"id": call_id, "name": call["name"] if call else name, "is_error": failed, "output": output},
            )  # fmt: skip
        )
        return events

    def _step(self, part: dict[str, Any]) -> list[AgentEvent]:
        tokens = mapping(part.get("tokens"))
        cache = mapping(tokens.get("cache"))
        usage = self.usage
        usage.input_tokens += _int(tokens.get("input"))
        usage.output_tokens += _int(tokens.get("output")) + _int(tokens.get("reasoning"))
        usage.reasoning_tokens += _int(tokens.get("reasoning"))
        usage.cache_read_tokens += _int(cache.get("read"))
        usage.cache_creation_tokens += _int(cache.get("write"))
        usage.turns += 1
        if self.prices:
            usage.cost_usd = estimate_cost(usage, self.prices)
        if part.get("reason") != "tool-calls":
            self.finished = True
        return [self._usage_event()]

    def _error(self, error: dict[str, Any]) -> list[AgentEvent]:
        data = mapping(error.get("data"))
        status = data.get("statusCode")
        self.error = str(data.get("message") or error.get("name") or "opencode reported an error")
        self.error_category = (
            "auth" if status in (401, 403) else "rate_limit" if status == 429 else
            "connection" if "connect" in self.error.lower() else "api_error"
        )  # fmt: skip
        self.finished = True
        return [AgentEvent("error", {"message": self.error, "category": self.error_category})]


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
