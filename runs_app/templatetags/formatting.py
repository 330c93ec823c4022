"""Formatting for the page templates (`{% load formatting %}`): durations, counts, money,
percentages, JSON, pass rates and diff lines. Every filter returns plain text, so Django's
auto-escaping still applies to whatever it is given (agent output included)."""

import json
import math
from datetime import timedelta
from typing import Any

import yaml
from django import template

from runs_app.analysis.stats import tally

register = template.Library()


@register.filter
def duration(value: float | timedelta | None) -> str:
    """Seconds (or a timedelta) as "850 ms", "4.2 s", "3 min 05 s" or "2 h 07 min"."""
    if value is None or value == "":
        return "—"
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


@register.filter
def compact(value: int | float | None) -> str:
    """12345 -> "12.3k", 2500000 -> "2.5M"."""
    if not value:
        return "0"
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.1f}{suffix}"
    return f"{value:g}"


@register.filter
def usd(value: float | None) -> str:
    """Dollars: "$0.0123", "$12.50"; "—" for an unknown (None) or not finite cost."""
    if value is None or not math.isfinite(value):
        return "—"
    if not value:
        return "$0"
    return f"${value:.4f}" if value < 1 else f"${value:,.2f}"


@register.filter
def percent(value: float | None, digits: int = 0) -> str:
    """A 0-1 proportion as a percentage ("—" for none)."""
    if value is None:
        return "—"
    return f"{100 * value:.{int(digits)}f}%"


@register.filter
def pp(value: float | None) -> str:
    """A 0-1 difference as signed percentage points, "+12.5" ("—" for none)."""
    if value is None:
        return "—"
    return f"{100 * value:+.1f}"


@register.filter
def pretty_json(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)


@register.simple_tag
def pass_rate(passed: int | None, failed: int | None) -> str:
    """The pass rate of the one rule (analysis.tally): errors are never counted as fails."""
    rate = tally.pass_rate(passed or 0, failed or 0)
    return f"{100 * rate:.0f}%" if rate is not None else "—"


FILE_HEADER_PREFIXES = (
    "diff ",
    "index ",
    "new file",
    "deleted file",
    "similarity ",
    "rename ",
    "Binary files",
)


@register.filter
def diff_lines(diff: str | None) -> list[tuple[str, str]]:
    """(css class, line) for each line of a unified diff: "file", "hunk", "add", "del" or "".

    The lines stay plain text for the template to escape; `--- a/x` / `+++ b/x` count as file
    headers only as a pair, so a removed line that starts with "--" is still a removal.
    """
    lines = (diff or "").splitlines()
    rows: list[tuple[str, str]] = []
    for i, line in enumerate(lines):
        rows.append(
            (_diff_class(line, lines[i - 1] if i else "", lines[i + 1] if i + 1 < len(lines) else ""), line)
        )
    return rows


def _diff_class(line: str, before: str, after: str) -> str:
    header_pair = (line.startswith("--- ") and after.startswith("+++ ")) or (
        line.startswith("+++ ") and before.startswith("--- ")
    )
    if line.startswith(FILE_HEADER_PREFIXES) or header_pair:
        return "file"
    if line.startswith("@@"):
        return "hunk"
    if line.startswith("+"):
        return "add"
    if line.startswith("-"):
        return "del"
    return ""


@register.filter
def detail_items(details) -> list[tuple[str, str, bool]]:
    """A criterion's details as (label, text, long): scalars inline, the rest as YAML."""
    if not isinstance(details, dict):
        return [("details", str(details), True)]
    items = []
    for key, value in details.items():
        if isinstance(value, str | int | float | bool) or value is None:
            text = "—" if value is None else str(value)
            items.append((str(key).replace("_", " "), text, "\n" in text or len(text) > 120))
        else:
            text = yaml.safe_dump(
                value, sort_keys=False, allow_unicode=True, default_flow_style=False
            ).strip()
            items.append((str(key).replace("_", " "), text, True))
    return items
