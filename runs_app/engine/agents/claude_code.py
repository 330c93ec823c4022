"""The ``claude-code`` agent: the real Claude Code CLI, run as users run it.

    claude -p PROMPT --output-format stream-json --verbose --model M --permission-mode P
           --allowedTools a,b [--max-turns N] [--append-system-prompt S] ...

Config keys: ``model``, ``permission_mode`` (default acceptEdits), ``allowed_tools`` (list or
"a,b"), ``disallowed_tools``, ``max_turns``, ``append_system_prompt``, ``system_prompt``,
``include_partial_messages`` (bool), ``max_budget_usd``, ``max_retries`` (CLAUDE_CODE_MAX_RETRIES),
``base_url`` (else ANTHROPIC_BASE_URL from the worker), ``extra_args`` (list), ``env`` (extra
non-secret variables), ``binary``, ``prices`` (USD per MTok: input/output/cache_write/cache_read,
for the live cost estimate); and coder-eval's ``system_prompt_mode``, ``setting_sources``,
``plugins`` (their folders already resolved by the runner), ``claude_settings``,
``context_window`` and ``sdk_options``, passed as coder-eval's SDK passes them (the table in
``experiments_app.specs.claude_options``).

The stream format is documented in shared/agent-samples/FORMATS.md; the points that matter here:
* one API response can come out as several ``assistant`` lines with the same ``message.id``, each
  repeating the usage: usage and turns are counted once per message id;
* ``assistant.message.usage`` is the ``message_start`` snapshot (output_tokens 1); the real output
  count comes from a ``stream_event`` ``message_delta`` (partial mode) or the final ``result``;
* the ``result`` line holds the CLI's own totals and cost, which replace the running estimate;
* API failures end with ``is_error: true`` (subtype still ``success``) after a synthetic assistant
  message whose model is ``<synthetic>``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from experiments_app.specs import claude_options as option_rules
from experiments_app.specs import providers
from experiments_app.specs.agent_kinds import KINDS
from runs_app.engine.usage import Usage, estimate_cost, stored_cost

from .base import (
    AgentEvent,
    AgentInvocation,
    AgentKind,
    AgentSetupError,
    BaseParser,
    clip,
    mapping,
    prompt_fits_argv,
    require_cli,
)

DEFAULT_ALLOWED_TOOLS = ["Bash", "Read", "Write", "Edit", "Glob", "Grep"]
API_KEY = providers.PROVIDERS["anthropic"].key_variable
SYNTHETIC_MODEL = "<synthetic>"

# List prices in USD per million tokens (input, output), used only for the live cost estimate
# until the CLI's own `total_cost_usd` arrives. First matching substring of the model id wins.
# Cache writes cost 1.25x input and cache reads 0.1x input.
MODEL_PRICES = (
    ("opus-4-0", 15.0, 75.0),
    ("opus-4-1", 15.0, 75.0),
    ("opus-4-2025", 15.0, 75.0),
    ("3-opus", 15.0, 75.0),
    ("opus", 5.0, 25.0),
    ("sonnet", 3.0, 15.0),
    ("3-5-haiku", 0.8, 4.0),
    ("3-haiku", 0.25, 1.25),
    ("haiku", 1.0, 5.0),
)


def model_prices(model: str) -> dict[str, float] | None:
    for fragment, price_in, price_out in MODEL_PRICES:
        if fragment in model:
            return {
                "input": price_in,
                "output": price_out,
                "cache_write": price_in * 1.25,
                "cache_read": price_in * 0.1,
            }
    return None


# `provider`: where Claude runs (a provider of the table). On Vertex and Bedrock the CLI skips
# its own cloud auth: the gateway adds the bearer token.
CLAUDE_PROVIDERS = ("anthropic", "vertex", "bedrock")


class ClaudeCodeAgent(AgentKind):
    info = KINDS["claude-code"]
    name = info.name
    needs_final_line = True

    def apis(self, config: Mapping[str, Any]) -> tuple[str, ...]:
        provider = str(config.get("provider") or "anthropic")
        return (provider if provider in CLAUDE_PROVIDERS else "anthropic",)

    def prepare(
        self, prompt: str, workspace: Path, home: Path, config: Mapping[str, Any], secrets: Mapping[str, str]
    ) -> AgentInvocation:
        provider = str(config.get("provider") or "anthropic")
        if provider not in CLAUDE_PROVIDERS:
            raise AgentSetupError(
                f"claude-code: provider must be one of {', '.join(CLAUDE_PROVIDERS)}, not {provider!r}"
            )
        if provider == "vertex" and not config.get("project_id"):
            raise AgentSetupError("claude-code: provider vertex needs project_id (the Google Cloud project)")
        if problems := option_rules.problems(config, resolved=True, placed=True):
            raise AgentSetupError(
                "claude-code: "
                + "; ".join(f"{'.'.join(map(str, where))}: {message}" for where, message in problems)
            )
        key = providers.PROVIDERS[provider].key_variable
        binary = require_cli(self.info, key, config, secrets)
        on_argv = prompt_fits_argv(prompt)
        argv = [binary, "-p", prompt] if on_argv else [binary, "-p"]
        argv += claude_options(config)
        return AgentInvocation(
            argv=argv,
            # Closed stdin: with an open pipe `claude -p` waits 3 s for input before starting.
            stdin=b"" if on_argv else prompt.encode(),
            env_extra=claude_env(config, secrets),
            # On Vertex and Bedrock the CLI sends no key at all (the gateway adds it).
            secrets_needed=[API_KEY] if provider == "anthropic" else [],
        )

    def parser(self, config: Mapping[str, Any] | None = None) -> ClaudeStreamParser:
        return ClaudeStreamParser(prices=(config or {}).get("prices"))

    def resume(
        self,
        prompt: str,
        session: str,
        workspace: Path,
        home: Path,
        config: Mapping[str, Any],
        secrets: Mapping[str, str],
    ) -> AgentInvocation:
        # The session lives in HOME/.claude/projects, which the trial keeps between turns.
        if not session:
            raise AgentSetupError("claude-code: the last turn reported no session_id to resume")
        invocation = self.prepare(prompt, workspace, home, config, secrets)
        invocation.argv = [*(invocation.argv or []), "--resume", session]
        return invocation


def claude_options(config: Mapping[str, Any]) -> list[str]:
    args = ["--output-format", "stream-json", "--verbose"]
    if config.get("model"):
        args += ["--model", str(config["model"])]
    args += ["--permission-mode", str(config.get("permission_mode") or "acceptEdits")]
    args += ["--allowedTools", _tool_list(config.get("allowed_tools"), DEFAULT_ALLOWED_TOOLS)]
    if config.get("disallowed_tools"):
        args += ["--disallowedTools", _tool_list(config["disallowed_tools"], [])]
    for key, flag in (
        ("max_turns", "--max-turns"),
        ("max_budget_usd", "--max-budget-usd"),
        ("append_system_prompt", "--append-system-prompt"),
    ):
        if config.get(key) not in (None, ""):
            args += [flag, str(config[key])]
    args += _system_prompt(config)
    if config.get("include_partial_messages"):
        args.append("--include-partial-messages")
    sources = config.get("setting_sources")
    args.append(
        "--setting-sources=" + ",".join(option_rules.DEFAULT_SETTING_SOURCES if sources is None else sources)
    )
    for plugin in config.get("plugins") or []:
        args += ["--plugin-dir", str(plugin["path"])]
    settings = config.get("claude_settings")
    if isinstance(settings, dict):
        args += ["--settings", json.dumps(settings)]
    elif isinstance(settings, str):
        args += ["--settings", settings]
    args += _sdk_flags(config.get("sdk_options") or {})
    return args + [str(arg) for arg in config.get("extra_args") or []]


def _system_prompt(config: Mapping[str, Any]) -> list[str]:
    """coder-eval's two regimes: `append` (default) layers the prompt on Claude Code's own, whose
    per-machine sections move to the first message (the SDK preset's exclude_dynamic_sections);
    `replace` sends it as the whole system prompt."""
    prompt = config.get("system_prompt")
    if config.get("system_prompt_mode") == "replace":
        return ["--system-prompt", str(prompt)]
    flags = ["--exclude-dynamic-system-prompt-sections"]
    if isinstance(prompt, str) and prompt.strip():
        flags = ["--append-system-prompt", prompt, *flags]
    return flags


def _sdk_flags(sdk: Mapping[str, Any]) -> list[str]:
    """`sdk_options` as the SDK's transport turns them into flags (claude_agent_sdk 0.2.189)."""
    args: list[str] = []
    if sdk.get("betas"):
        args += ["--betas", ",".join(sdk["betas"])]
    if sdk.get("fallback_model"):
        args += ["--fallback-model", str(sdk["fallback_model"])]
    if sdk.get("include_hook_events"):
        args.append("--include-hook-events")
    if sdk.get("strict_mcp_config"):
        args.append("--strict-mcp-config")
    thinking = sdk.get("thinking")
    if thinking is not None:
        if thinking["type"] == "enabled":
            args += ["--max-thinking-tokens", str(thinking["budget_tokens"])]
        else:
            args += ["--thinking", thinking["type"]]
        if thinking["type"] != "disabled" and "display" in thinking:
            args += ["--thinking-display", str(thinking["display"])]
    elif sdk.get("max_thinking_tokens") is not None:
        args += ["--max-thinking-tokens", str(sdk["max_thinking_tokens"])]
    if sdk.get("effort") is not None:
        args += ["--effort", str(sdk["effort"])]
    output_format = sdk.get("output_format")
    if isinstance(output_format, dict) and output_format.get("schema") is not None:
        args += ["--json-schema", json.dumps(output_format["schema"])]
    return args


def _tool_list(value: Any, default: list[str]) -> str:
    if value is None:
        return ",".join(default)
    if isinstance(value, str):
        return value
    return ",".join(str(tool) for tool in value)


def claude_env(config: Mapping[str, Any], secrets: Mapping[str, str]) -> dict[str, str]:
    env = {str(k): str(v) for k, v in (config.get("env") or {}).items()}
    # No telemetry, update checks or error reports from inside a trial: they are not the agent's
    # work, and they would reach the internet from the sandbox.
    env.update(
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        DISABLE_TELEMETRY="1",
        DISABLE_AUTOUPDATER="1",
        DISABLE_ERROR_REPORTING="1",
    )
    provider = str(config.get("provider") or "anthropic")
    region = str(config.get("region") or providers.PROVIDERS[provider].default_region)
    if provider == "vertex":
        env.update(CLAUDE_CODE_USE_VERTEX="1", CLAUDE_CODE_SKIP_VERTEX_AUTH="1", CLOUD_ML_REGION=region,
                   ANTHROPIC_VERTEX_PROJECT_ID=str(config.get("project_id") or ""))  # fmt: skip
        if config.get("base_url") or secrets.get("ANTHROPIC_VERTEX_BASE_URL"):
            env["ANTHROPIC_VERTEX_BASE_URL"] = str(
                config.get("base_url") or secrets["ANTHROPIC_VERTEX_BASE_URL"]
            )
    elif provider == "bedrock":
        env.update(CLAUDE_CODE_USE_BEDROCK="1", CLAUDE_CODE_SKIP_BEDROCK_AUTH="1", AWS_REGION=region)
        if config.get("base_url") or secrets.get("ANTHROPIC_BEDROCK_BASE_URL"):
            env["ANTHROPIC_BEDROCK_BASE_URL"] = str(
                config.get("base_url") or secrets["ANTHROPIC_BEDROCK_BASE_URL"]
            )
    elif config.get("base_url") or secrets.get("ANTHROPIC_BASE_URL"):
        env["ANTHROPIC_BASE_URL"] = str(config.get("base_url") or secrets["ANTHROPIC_BASE_URL"])
    if config.get("max_retries") is not None:
        env["CLAUDE_CODE_MAX_RETRIES"] = str(int(config["max_retries"]))
    if config.get("context_window") is not None:
        # Outranks --settings' autoCompactWindow and every settings scope (coder-eval's way).
        env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] = str(int(config["context_window"]))
    sdk = config.get("sdk_options") or {}
    for key, variable in option_rules.SDK_ENV.items():
        if key == "enable_file_checkpointing" and sdk.get(key):
            env[variable] = "true"
        elif key == "client_app" and sdk.get(key) is not None:
            env[variable] = str(sdk[key])
    return env


class ClaudeStreamParser(BaseParser):
    """Parses ``--output-format stream-json --verbose`` lines; ``usage`` is live after each line."""

    def __init__(self, prices: Mapping[str, float] | None = None) -> None:
        super().__init__()
        self.prices = dict(prices) if prices else None
        self.model = ""
        self.session_id = ""
        self.cli_version = ""
        self.retries: list[dict[str, Any]] = []
        self.result: dict[str, Any] | None = None
        self.cli_num_turns: int | None = None
        self.model_usage: dict[str, Any] = {}
        self._messages: dict[str, dict[str, int]] = {}  # message id -> its usage, counted once
        self._main_turns: set[str] = set()
        self._streaming_id = ""  # message id of the current partial-message stream
        self._synthetic_kind = ""

    def _parse(self, obj: dict[str, Any]) -> list[AgentEvent] | None:
        kind = obj.get("type")
        if kind == "system":
            return self._system(obj)
        if kind == "stream_event":
            return self._stream_event(obj.get("event") or {}, obj.get("parent_tool_use_id"))
        if kind == "assistant":
            return self._assistant(obj)
        if kind == "user":
            return self._user(obj)
        if kind == "result":
            return self._result(obj)
        return []

    def _system(self, obj: dict[str, Any]) -> list[AgentEvent]:
        subtype = obj.get("subtype")
        if subtype == "init":
            self.model = str(obj.get("model") or "")
            self.session_id = str(obj.get("session_id") or "")
            self.cli_version = str(obj.get("claude_code_version") or "")
            data = {"subtype": "init", "model": self.model, "session_id": self.session_id}
            return [
                AgentEvent("system", {**data, "version": self.cli_version, "tools": obj.get("tools", [])})
            ]
        if subtype == "api_retry":
            retry = {
                k: obj.get(k) for k in ("attempt", "max_retries", "retry_delay_ms", "error_status", "error")
            }
            self.retries.append(retry)
            if retry["error"] == "authentication_failed" and not self.fatal:
                # Retrying a rejected key only burns minutes (10 retries take ~3 min): stop now.
                self.fatal = (
                    f"the model API rejected the API key (HTTP {retry['error_status']}); "
                    f"check {API_KEY} in the worker's environment"
                )
                self.fatal_category = "auth"
            return [AgentEvent("system", {"subtype": "api_retry", **retry})]
        if subtype == "status":
            return []  # "requesting" before each API call: noise for the trial's story
        return [AgentEvent("system", {"subtype": subtype})]

    def _stream_event(self, event: dict[str, Any], parent: Any) -> list[AgentEvent]:
        # Partial mode: message_start gives input usage first, message_delta the real output count.
        if event.get("type") == "message_start":
            message = event.get("message") or {}
            self._streaming_id = str(message.get("id") or "")
            return self._count(self._streaming_id, message.get("usage") or {}, main=parent is None)
        if event.get("type") == "message_delta" and self._streaming_id:
            output = (event.get("usage") or {}).get("output_tokens")
            return self._count(self._streaming_id, {"output_tokens": output}, main=parent is None)
        return []

    def _assistant(self, obj: dict[str, Any]) -> list[AgentEvent]:
        message = obj.get("message") or {}
        if message.get("model") == SYNTHETIC_MODEL:
            return self._synthetic(obj, message)
        self.model = str(message.get("model") or self.model)
        main = obj.get("parent_tool_use_id") is None
        events = self._count(str(message.get("id") or ""), message.get("usage") or {}, main=main)
        for block in message.get("content") or []:
            events += self._block(block, main)
        return events

    def _block(self, block: dict[str, Any], main: bool) -> list[AgentEvent]:
        if block.get("type") == "text":
            if main:
                self.final_text = block.get("text", "")
            return [AgentEvent("message", {"text": block.get("text", ""), "main": main})]
        if block.get("type") == "tool_use":
            tool_input = mapping(block.get("input"))
            event = self._add_tool_call(str(block.get("id") or ""), str(block.get("name") or ""), tool_input)
            return [event] if event else []
        if block.get("type") == "thinking":
            return [
                AgentEvent("message", {"text": block.get("thinking", ""), "thinking": True, "main": main})
            ]
        return []

    def _synthetic(self, obj: dict[str, Any], message: dict[str, Any]) -> list[AgentEvent]:
        """The CLI's own message after an API failure: the error text, before the result line."""
        text = " ".join(b.get("text", "") for b in message.get("content") or [] if b.get("type") == "text")
        self._synthetic_kind = str(obj.get("error") or "")
        self.error = text or "the model API call failed"
        self.error_category = _category(None, self._synthetic_kind, "", "", self.retries, text)
        return [AgentEvent("error", {"message": self.error, "category": self.error_category})]

    def _count(self, message_id: str, usage: Mapping[str, Any], *, main: bool) -> list[AgentEvent]:
        """Add one API message's usage once; later lines of the same id may only raise its numbers."""
        if not message_id:
            return []
        counted = self._messages.setdefault(message_id, {})
        changed = False
        for key in (
            "input_tokens",
            "output_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
        ):
            value = usage.get(key)
            if isinstance(value, int) and value > counted.get(key, 0):
                counted[key] = value
                changed = True
        if main and message_id not in self._main_turns:
            self._main_turns.add(message_id)
            changed = True
        if not changed or self.result is not None:
            return []
        self._recount()
        return [self._usage_event()]

    def _recount(self) -> None:
        def total(key: str) -> int:
            return sum(counted.get(key, 0) for counted in self._messages.values())

        self.usage = Usage(
            input_tokens=total("input_tokens"),
            output_tokens=total("output_tokens"),
            cache_read_tokens=total("cache_read_input_tokens"),
            cache_creation_tokens=total("cache_creation_input_tokens"),
            turns=len(self._main_turns),
        )
        prices = self.prices or model_prices(self.model)
        if prices:
            self.usage.cost_usd = estimate_cost(self.usage, prices)

    def _user(self, obj: dict[str, Any]) -> list[AgentEvent]:
        content = (obj.get("message") or {}).get("content")
        if not isinstance(content, list):
            return []
        events = []
        for block in content:
            if not isinstance(block, dict) or block.get("type") != "tool_result":
                continue
            call_id = str(block.get("tool_use_id") or "")
            is_error = block.get("is_error") is True  # a Write result has no is_error key at all
            output = clip(_result_text(block.get("content")))
            call = self._calls_by_id.get(call_id)
            if call is not None:
                call["status"] = "error" if is_error else "success"
                call["output"] = output
            name = call["name"] if call else ""
            events.append(
                AgentEvent(
                    "tool_result", {"id": call_id, "name": name, "is_error": is_error, "output": output}
                )
            )
        return events

    def _result(self, obj: dict[str, Any]) -> list[AgentEvent]:
        self.result = obj
        self.finished = True
        self.cli_num_turns = obj.get("num_turns")
        self.model_usage = obj.get("modelUsage") or {}
        usage = obj.get("usage") or {}
        # The CLI's totals are the sum over its API calls, with exact output counts: they win.
        self.usage = Usage(
            input_tokens=int(usage.get("input_tokens") or 0),
            output_tokens=int(usage.get("output_tokens") or 0),
            cache_read_tokens=int(usage.get("cache_read_input_tokens") or 0),
            cache_creation_tokens=int(usage.get("cache_creation_input_tokens") or 0),
            cost_usd=stored_cost(obj.get("total_cost_usd")),
            turns=self._turns_at_end(obj),
        )
        if isinstance(obj.get("result"), str):
            self.final_text = obj["result"]
        self._note_denials(obj.get("permission_denials") or [])
        events = [self._usage_event()]
        # Check is_error, never the subtype alone: API errors come with subtype "success".
        if obj.get("is_error"):
            self.error = _result_error(obj)
            self.error_category = _category(
                obj.get("api_error_status"),
                self._synthetic_kind,
                str(obj.get("subtype") or ""),
                str(obj.get("terminal_reason") or ""),
                self.retries,
                self.error,
            )
            events.append(AgentEvent("error", {"message": self.error, "category": self.error_category}))
        return events

    def _turns_at_end(self, obj: Mapping[str, Any]) -> int:
        """Model calls that answered. The CLI's num_turns also counts a call blocked by --max-turns
        and a failed call, so it is only used when no assistant line was seen (``--output-format
        json``) and the run succeeded."""
        if self._main_turns or obj.get("is_error"):
            return len(self._main_turns)
        return obj["num_turns"] if isinstance(obj.get("num_turns"), int) else 0

    def _note_denials(self, denials: list[dict[str, Any]]) -> None:
        self.permission_denials = [
            {
                "tool_name": d.get("tool_name"),
                "tool_use_id": d.get("tool_use_id"),
                "tool_input": d.get("tool_input"),
            }
            for d in denials
        ]
        for denial in self.permission_denials:
            call = self._calls_by_id.get(str(denial["tool_use_id"]))
            if call is not None:
                call["denied"] = True
                call["status"] = "error"


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _result_error(obj: Mapping[str, Any]) -> str:
    errors = obj.get("errors")
    if isinstance(errors, list) and errors:
        return "; ".join(str(e) for e in errors)
    if isinstance(obj.get("result"), str) and obj["result"]:
        return obj["result"]
    return f"Claude Code ended with an error ({obj.get('subtype')}, {obj.get('terminal_reason')})"


def _category(
    status: Any, synthetic: str, subtype: str, terminal: str, retries: list[dict[str, Any]], text: str
) -> str:
    """Name the failure from the HTTP status, the CLI's error words and the retries before it."""
    if subtype == "error_max_turns" or terminal == "max_turns":
        return "max_turns"
    if subtype.startswith("error_max_budget"):
        return "max_usd"
    last_retry = retries[-1]["error"] if retries else ""
    if status in (401, 403) or "authentication_failed" in (synthetic, last_retry):
        return "auth"
    if status == 429 or "rate_limit" in (synthetic, last_retry):
        return "rate_limit"
    if status == 529 or last_retry == "overloaded":
        return "overloaded"
    if terminal == "prompt_too_long":
        return "prompt_too_long"
    if status == 400 or synthetic == "invalid_request":
        return "invalid_request"
    if status is None and (last_retry == "unknown" or "Unable to connect" in text):
        return "connection"
    return "api_error"
