"""Durations in the job scheduler's config files, e.g. "1h30m"."""


def parse_duration(text: str) -> int:
    """Return the number of seconds in a duration such as "1d2h", "90s" or "1h 30m".

    A duration is one or more components, each a non-negative integer followed by a unit:
    d (days), h (hours), m (minutes), s (seconds). Units appear at most once and in that
    order (d, h, m, s). Units are case-insensitive; spaces are allowed between components
    and around the whole text. Anything else (empty text, unknown units, repeated or
    out-of-order units, missing numbers, signs, decimals) raises ValueError.
    """
    raise NotImplementedError
