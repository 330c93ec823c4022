"""Model prices in USD per million tokens, for the gateway's cost of every model call (no Django).

First matching fragment of the model id wins, so more specific fragments come first. A variant
overrides them with `agent.prices: {input, output, cache_write, cache_read}` (USD per MTok).
Anthropic bills cache writes at 1.25x and cache reads at 0.1x input; OpenAI bills cached input
at the `cache_read` price and has no cache-write charge.
"""

from __future__ import annotations

from collections.abc import Mapping

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
