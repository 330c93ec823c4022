"""The ``aider`` agent: Aider (PyPI ``aider-chat``, in its own virtualenv under ``.agents/``).

    aider --model openai/MODEL --openai-api-base URL --message-file PROMPT --no-git ...   (stdin closed)

With stdin closed every question takes its default (yes), so the shell commands the model
suggests run, as a user who answers yes would have them run. Everything that would reach the
network besides the model is switched off (version check, analytics, the price map, browsers,
URL fetching), the repo map is off (``map_tokens``), and the model's context size and prices come
from a metadata file in HOME (Aider would fetch them). The model's API is OpenAI Chat Completions
at the config key ``base_url`` (else the worker's OPENAI_BASE_URL; through the gateway, its URL).

Config keys: ``model`` (default gpt-5.5), ``base_url``, ``edit_format`` (Aider's per-model
default otherwise), ``map_tokens`` (default 0), ``network_retry_limit`` (default 3), ``extra_args``,
``env``, ``binary``, ``prices``.

Aider prints text, not JSON. Lines read: ``Tokens: 1.2k sent, 20 received. Cost: ...`` ends
one model call (the text before it is the reply); ``Applied edit to PATH`` is an edit;
``Running CMD`` a shell command; ``litellm.<Name>Error: ...`` an API failure, which Aider
retries 9 times over about a minute and then exits 0 anyway: a rejected key stops the run at
once, other failures after ``network_retry_limit`` retries.
"""

from __future__ import annotations

import json
import re
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
    require_cli,
)

API_KEY = PROVIDERS["openai"].key_variable
DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_MODEL = "gpt-5.5"
ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm's bundled price map, not GitHub's
    "HF_HUB_OFFLINE": "1",
    "BROWSER": "true",  # Aider opens URLs (docs, errors) in a browser: a no-op
    "TERM": "dumb",
    "NO_COLOR": "1",
    "COLUMNS": "100000",  # no wrapping: one printed line is one line of meaning
}
FLAGS = [
    "--no-git", "--no-stream", "--no-pretty", "--no-fancy-input", "--no-check-update",
    "--no-show-release-notes", "--no-analytics", "--no-show-model-warnings", "--no-detect-urls",
    "--disable-playwright", "--no-auto-lint", "--timeout", "120",
]  # fmt: skip
TOKENS = re.compile(
    r"^Tokens: ([\d.]+)(k?) sent(?:, ([\d.]+)(k?) cache write)?(?:, ([\d.]+)(k?) cache hit)?, "
    r"([\d.]+)(k?) received"
)
QUESTION = re.compile(r"^.*\? \(Y\)es/\(N\)o.*?\]: ")
API_ERROR = re.compile(r"^litellm\.(\w+): (.*)")
CATEGORIES = {"AuthenticationError": "auth", "PermissionDeniedError": "auth", "RateLimitError": "rate_limit",
              "APIConnectionError": "connection", "Timeout": "connection"}  # fmt: skip
SETTINGS = "- name: {model}\n  extra_params:\n    max_retries: 0\n"
BANNER = (
    "Aider v",
    "Model:",
    "Git repo:",
    "Repo-map:",
    "Detected dumb terminal",
    "Weak model:",
    "Main model:",
)


class AiderAgent(AgentKind):
    info = KINDS["aider"]
    name = info.name

    def prepare(
        self, prompt: str, workspace: Path, home: Path, config: Mapping[str, Any], secrets: Mapping[str, str]
    ) -> AgentInvocation:
        binary = require_cli(self.info, API_KEY, config, secrets)
        model = f"openai/{config.get('model') or DEFAULT_MODEL}"
        base_url = config.get("base_url") or secrets.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
        state = home / ".aider"
        argv = [binary, "--model", model, "--openai-api-base", str(base_url).rstrip("/")]
        argv += ["--model-metadata-file", str(state / "model-metadata.json")]
        argv += ["--model-settings-file", str(state / "model-settings.yml")]
        argv += [
            "--message-file",
            str(state / "prompt.md"),
            "--map-tokens",
            str(int(config.get("map_tokens", 0))),
        ]
        if config.get("edit_format"):
            argv += ["--edit-format", str(config["edit_format"])]
        argv += FLAGS + ["--analytics-log", str(state / "analytics.jsonl")]
        argv += ["--chat-history-file", str(state / "chat.history.md")]
        argv += ["--llm-history-file", str(state / "llm.history.txt")]
        argv += ["--input-history-file", str(state / "input.history")]
        argv += [str(arg) for arg in config.get("extra_args") or []]
        env = {**{str(k): str(v) for k, v in (config.get("env") or {}).items()}, **ENV}
        return AgentInvocation(
            argv=argv,
            stdin=b"",
            env_extra=env,
            secrets_needed=[API_KEY],
            files_to_write={
                str(state / "prompt.md"): prompt.encode(),
                str(state / "model-metadata.json"): _metadata(model, config).encode(),
                # The OpenAI client's own retries come on top of Aider's nine: none.
                str(
                    state / "model-settings.yml"
                ): f"- name: {json.dumps(model)}\n  extra_params:\n    max_retries: 0\n".encode(),
            },
        )

    def parser(self, config: Mapping[str, Any] | None = None) -> AiderOutputParser:
        config = config or {}
        model = str(config.get("model") or DEFAULT_MODEL)
        return AiderOutputParser(
            prices=config.get("prices") or model_prices(model),
            network_retry_limit=int(config.get("network_retry_limit", 3)),
        )


def _metadata(model: str, config: Mapping[str, Any]) -> str:
    prices = config.get("prices") or model_prices(str(config.get("model") or DEFAULT_MODEL)) or {}
    entry = {
        "max_input_tokens": 200_000, "max_output_tokens": 32_000, "max_tokens": 32_000,
        "input_cost_per_token": prices.get("input", 0.0) / 1e6,
        "output_cost_per_token": prices.get("output", 0.0) / 1e6,
        "litellm_provider": "openai", "mode": "chat",
    }  # fmt: skip
    return json.dumps({model: entry}) + "\n"


class AiderOutputParser(BaseParser):
    def __init__(self, prices: Mapping[str, float] | None = None, network_retry_limit: int = 3) -> None:
        super().__init__()
        self.prices = dict(prices) if prices else None
        self.network_retry_limit = network_retry_limit
        self.failures = 0
        self._reply: list[str] = []
        self._command: dict[str, Any] | None = None

    def feed_line(self, line: str | bytes) -> list[AgentEvent]:
        if isinstance(line, bytes):
            line = line.decode("utf-8", errors="replace")
        line = QUESTION.sub("", line.rstrip("\r\n"))
        if line.startswith(BANNER):
            return [AgentEvent("system", {"text": line})]
        if match := TOKENS.match(line):
            return self._tokens(match)
        if line.startswith("Applied edit to "):
            return self._tool("Edit", {"file_path": line.removeprefix("Applied edit to ").strip()})
        if line.startswith("Running "):
            return self._tool("Bash", {"command": line.removeprefix("Running ").strip()})
        if match := API_ERROR.match(line):
            return self._api_error(match.group(1), match.group(2))
        if line.strip():
            self._reply.append(line)
        return [AgentEvent("output", {"text": line})] if line.strip() else []

    def _tokens(self, match: re.Match) -> list[AgentEvent]:
        sent, write, hit, received = (_count(match.group(i), match.group(i + 1)) for i in (1, 3, 5, 7))
        usage = self.usage
        usage.input_tokens += max(0, sent - write - hit)
        usage.cache_creation_tokens += write
        usage.cache_read_tokens += hit
        usage.output_tokens += received
        usage.turns += 1
        if self.prices:
            usage.cost_usd = estimate_cost(usage, self.prices)
        self.error = self.error_category = None  # the call went through: earlier failures were retried
        events = []
        if self._reply:
            self.final_text = "\n".join(self._reply).strip()
            events.append(AgentEvent("message", {"text": self.final_text}))
            self._reply = []
        return [*events, self._usage_event()]

    def _tool(self, name: str, tool_input: dict[str, Any]) -> list[AgentEvent]:
        call_id = f"call_{len(self.tool_calls)}"
        event = self._add_tool_call(call_id, name, tool_input)
        # Aider shows no exit status of a command; an edit it reports was applied.
        self._calls_by_id[call_id]["status"] = "success"
        return [event] if event else []

    def _api_error(self, name: str, message: str) -> list[AgentEvent]:
        self.error, self.error_category = f"{name}: {message}", CATEGORIES.get(name, "api_error")
        self.failures += 1
        if self.error_category == "auth" or self.failures > self.network_retry_limit:
            self.fatal, self.fatal_category = self.error, self.error_category
        return [AgentEvent("error", {"message": self.error, "category": self.error_category})]


def _count(number: str | None, thousands: str | None) -> int:
    if not number:
        return 0
    return round(float(number) * (1000 if thousands else 1))
