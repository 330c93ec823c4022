"""The model calls a worker makes itself for a trial: the simulated user's (the answerer) and the
judge's. Each role has a gateway of its own, so its calls are counted, priced and budgeted apart
from the agent's and from each other's, the same way as the agent's (plain Python, no Django).

A role's budget (`budgets.<role>` in the task or a layer: `max_total_tokens`, `max_input_tokens`,
`max_output_tokens`, `max_usd`, `max_calls`) is enforced by its gateway: once crossed, the next
call is refused and `post` raises `BudgetRefused`.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from experiments_app.specs.providers import PROVIDERS
from runs_app.engine.gateway.providers import ProviderError, Upstream, role_upstream
from runs_app.engine.gateway.proxy import Gateway
from runs_app.engine.usage import Usage

ROLES = ("agent", "answerer", "judge")
MAX_REPLY_BYTES = 2 << 20
DEFAULT_MODELS = {name: row.role_model for name, row in PROVIDERS.items() if row.role_model}


class ModelCallError(RuntimeError):
    """A role's model call failed (unreachable, an HTTP error, not JSON)."""


class BudgetRefused(ModelCallError):
    """The role's budget is used up: its gateway refused the call."""

    def __init__(self, role: str, limit: str):
        self.role, self.limit = role, limit
        super().__init__(f"the {role}'s {limit} budget is used up (budgets.{role})")


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("gateway", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def budget_limits(budget: Mapping[str, Any] | None) -> dict[str, Any]:
    """A role's `budgets` entry in the gateway's terms (its call cap is the gateway's `max_turns`)."""
    budget = budget or {}
    limits = {k: v for k, v in budget.items() if k != "max_calls" and v is not None}
    if budget.get("max_calls") is not None:
        limits["max_turns"] = budget["max_calls"]
    return limits


def endpoint(env: Mapping[str, str], provider_variable: str) -> tuple[str, Upstream]:
    """The API a role calls, chosen by `provider_variable` in the worker's environment
    (anthropic by default), with its key and endpoint from the same environment."""
    try:
        found = role_upstream(env, provider_variable)
    except ProviderError as exc:
        raise ModelCallError(str(exc)) from None
    return found.api, found


class RoleClient:
    """One role's model calls for one trial, through its own gateway on `socket_path`."""

    def __init__(
        self,
        role: str,
        socket_path: Path,
        upstream: Upstream,
        budget: Mapping[str, Any] | None = None,
        prices: Mapping[str, float] | None = None,
    ) -> None:
        self.role, self.api = role, upstream.api
        limits = budget_limits(budget)
        self.gateway = Gateway(socket_path, [upstream], limits=limits, prices=dict(prices or {}) or None)
        self.gateway.start()
        os.chmod(socket_path, 0o600)  # the worker's own: no sandbox mounts it

    def post(self, body: dict, timeout: float = 120.0, headers: Mapping[str, str] | None = None) -> dict:
        """POST a Messages / Chat Completions request; the JSON reply, or ModelCallError."""
        path = f"/{self.api}/{PROVIDERS[self.api].role_path}"
        send = {"content-type": "application/json", **(headers or {})}
        if self.api == "anthropic":
            send.setdefault("anthropic-version", "2023-06-01")
        conn = _UnixConnection(str(self.gateway.socket_path), timeout)
        try:
            conn.request("POST", path, body=json.dumps(body).encode(), headers=send)
            response = conn.getresponse()
            raw = response.read(MAX_REPLY_BYTES)
        except OSError as exc:
            raise ModelCallError(f"the {self.role}'s model call failed: {exc}") from None
        finally:
            conn.close()
        if response.status == 429 and (crossed := self.gateway.stop_reason()):
            # The gateway counts calls as turns; a role's budget names them calls.
            raise BudgetRefused(self.role, "max_calls" if crossed == "max_turns" else crossed)
        if response.status >= 400:
            text = raw[:500].decode("utf-8", errors="replace")
            raise ModelCallError(f"the {self.role}'s model server answered HTTP {response.status}: {text}")
        try:
            reply = json.loads(raw)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            raise ModelCallError(f"the {self.role}'s model server answered something that is not JSON")
        return reply

    def drain(self) -> list[dict[str, Any]]:
        """The calls made since the last drain, as usage events naming the role."""
        return [{**call, "role": self.role} for call in self.gateway.drain()]

    def totals(self) -> Usage:
        return self.gateway.totals()

    def close(self) -> None:
        self.gateway.settle()
        self.gateway.close()


def usage_summary(usage: Usage) -> dict[str, Any]:
    """A role's totals as stored on the trial (`Trial.role_usage`)."""
    return {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cache_read_tokens": usage.cache_read_tokens,
        "cache_creation_tokens": usage.cache_creation_tokens,
        "total_tokens": usage.total_tokens,
        "cost_usd": usage.cost_usd or 0.0,
        "calls": usage.turns,
    }


def reply_text(api: str, reply: dict) -> str:
    """The text of a Messages or Chat Completions reply."""
    try:
        if api == "anthropic":
            blocks = reply.get("content") or []
            return "".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
        return str(reply["choices"][0]["message"].get("content") or "")
    except (AttributeError, KeyError, IndexError, TypeError) as exc:
        raise ModelCallError(f"the model's reply has an unexpected shape ({exc!r})") from None


def chat_body(api: str, model: str, system: str, messages: list[dict], max_tokens: int) -> dict:
    """A request in the API's own shape: `messages` alternate user / assistant, user first."""
    if api == "anthropic":
        return {"model": model, "max_tokens": max_tokens, "system": system, "messages": messages}
    return {
        "model": model,
        "max_completion_tokens": max_tokens,
        "messages": [{"role": "system", "content": system}, *messages],
    }
