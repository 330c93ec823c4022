"""Durations in the job scheduler's config files, e.g. "1h30m"."""

import re

SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
# Each unit optional, in order; the lookahead refuses the empty string.
DURATION = re.compile(
    r"(?=\s*\d)\s*(?:(\d+)d)?\s*(?:(\d+)h)?\s*(?:(\d+)m)?\s*(?:(\d+)s)?\s*",
    re.IGNORECASE | re.ASCII,
)


def parse_duration(text: str) -> int:
    """Return the number of seconds in a duration such as "1d2h", "90s" or "1h 30m".

    A duration is one or more components, each a non-negative integer followed by a unit:
    d (days), h (hours), m (minutes), s (seconds). Units appear at most once and in that
    order (d, h, m, s). Units are case-insensitive; spaces are allowed between components
    and around the whole text. Anything else (empty text, unknown units, repeated or
    out-of-order units, missing numbers, signs, decimals) raises ValueError.
    """
    match = DURATION.fullmatch(text)
    if match is None or not any(match.groups()):
        raise ValueError(f"not a duration: {text!r}")
    amounts = [int(group or 0) for group in match.groups()]
    return sum(amount * SECONDS[unit] for amount, unit in zip(amounts, "dhms"))
