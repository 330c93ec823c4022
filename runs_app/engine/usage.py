"""Token usage, the budget rule, cost estimation and model prices: below the gateway (which
counts every model call) and the agents (which report their own), so both count the same way.
No Django.

Prices are USD per million tokens; the first matching fragment of the model id wins, so more
specific fragments come first. A variant overrides them with `agent.prices: {input, output,
cache_write, cache_read}` (USD per MTok). Anthropic bills cache writes at 1.25x and cache reads at
0.1x input; OpenAI bills cached input at the `cache_read` price and has no cache-write charge.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any


def stored_cost(value: Any) -> float:
    """A cost as a trial stores it: a finite, non-negative number of USD; anything else (None,
    text, NaN or infinity an agent reported, a negative) is 0, the cost being unknown. A NaN
    stored would spoil every sum it enters, and no JSON reader accepts it."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    try:
        cost = float(value)
    except OverflowError:  # an integer past float's range
        return 0.0
    return cost if math.isfinite(cost) and cost >= 0 else 0.0


@dataclass
class Usage:
    """Token usage and cost, normalised across CLIs.

    ``input_tokens`` counts input tokens NOT read from the cache (Anthropic's meaning). Codex reports
    input including cached tokens; its parser subtracts them so both CLIs add up the same way.
    ``cost_usd`` is None when neither the stream nor a price table gives a cost.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_creation_tokens: int = 0
    cost_usd: float | None = None
    turns: int = 0
    reasoning_tokens: int = 0  # informational: already included in output_tokens

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens + self.cache_read_tokens + self.cache_creation_tokens

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total_tokens": self.total_tokens}


def budget_crossed(usage: Usage, limits: Mapping[str, Any]) -> str | None:
    """Name of the first run limit crossed by `usage`, else None: the one rule for budgets,
    used by the gateway on every model call and by the runner on every parsed line.

    `max_input_tokens` counts cache reads / writes only with `count_cached_input` /
    `count_cache_creation`; `max_total_tokens` counts every token; `max_turns` model calls.
    """
    inputs = usage.input_tokens
    inputs += usage.cache_read_tokens if limits.get("count_cached_input") else 0
    inputs += usage.cache_creation_tokens if limits.get("count_cache_creation") else 0
    checks = (
        ("max_total_tokens", usage.total_tokens),
        ("max_input_tokens", inputs),
        ("max_output_tokens", usage.output_tokens),
        ("max_usd", usage.cost_usd),
        ("max_turns", usage.turns),
    )
    for name, used in checks:
        cap = limits.get(name)
        if cap is not None and used is not None and used > cap:
            return name
    return None


def summed(usages: list[Usage]) -> Usage:
    """Several runs' usage added up (a conversation's turns); the cost stays None when none had one."""
    total = Usage()
    for usage in usages:
        for name in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_creation_tokens", "turns",
                     "reasoning_tokens"):  # fmt: skip
            setattr(total, name, getattr(total, name) + getattr(usage, name))
        if usage.cost_usd is not None:
            total.cost_usd = (total.cost_usd or 0.0) + usage.cost_usd
    return total


def estimate_cost(usage: Usage, prices: Mapping[str, float]) -> float:
    """USD from per-million-token prices: ``input``, ``output``, ``cache_write``, ``cache_read``."""
    return (
        usage.input_tokens * prices.get("input", 0.0)
        + usage.output_tokens * prices.get("output", 0.0)
        + usage.cache_creation_tokens * prices.get("cache_write", 0.0)
        + usage.cache_read_tokens * prices.get("cache_read", 0.0)
    ) / 1_000_000


# (fragment, input, output, cache_write, cache_read)
MODEL_PRICES: tuple[tuple[str, float, float, float, float], ...] = (
    ("opus-4-0", 15.0, 75.0, 18.75, 1.5),
    ("opus-4-1", 15.0, 75.0, 18.75, 1.5),
    ("opus-4-2025", 15.0, 75.0, 18.75, 1.5),
    ("3-opus", 15.0, 75.0, 18.75, 1.5),
    ("opus", 5.0, 25.0, 6.25, 0.5),
    ("sonnet", 3.0, 15.0, 3.75, 0.3),
    ("3-5-haiku", 0.8, 4.0, 1.0, 0.08),
    ("3-haiku", 0.25, 1.25, 0.3125, 0.025),
    ("haiku", 1.0, 5.0, 1.25, 0.1),
    ("gpt-5-nano", 0.05, 0.4, 0.0, 0.005),
    ("gpt-5-mini", 0.25, 2.0, 0.0, 0.025),
    ("gpt-5", 1.25, 10.0, 0.0, 0.125),
    ("gpt-4.1-nano", 0.1, 0.4, 0.0, 0.025),
    ("gpt-4.1-mini", 0.4, 1.6, 0.0, 0.1),
    ("gpt-4.1", 2.0, 8.0, 0.0, 0.5),
    ("gpt-4o-mini", 0.15, 0.6, 0.0, 0.075),
    ("gpt-4o", 2.5, 10.0, 0.0, 1.25),
    ("o4-mini", 1.1, 4.4, 0.0, 0.275),
    ("o3", 2.0, 8.0, 0.0, 0.5),
    # Gemini (prompts up to 200k tokens): cached input at the cache_read price, no write charge.
    ("gemini-2.5-flash-lite", 0.1, 0.4, 0.0, 0.025),
    ("gemini-2.5-flash", 0.3, 2.5, 0.0, 0.075),
    ("gemini-2.5-pro", 1.25, 10.0, 0.0, 0.31),
)
PRICE_KEYS = ("input", "output", "cache_write", "cache_read")


def model_prices(model: str, overrides: Mapping[str, float] | None = None) -> dict[str, float] | None:
    """The per-MTok prices of `model`: the variant's override, else the table, else None."""
    if overrides:
        return {key: float(overrides.get(key, 0.0)) for key in PRICE_KEYS}
    for fragment, *prices in MODEL_PRICES:
        if fragment in (model or ""):
            return dict(zip(PRICE_KEYS, prices, strict=True))
    return None
