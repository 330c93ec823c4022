"""Small statistics helpers used by the nightly reporting job."""


def mean(values):
    """Return the arithmetic mean of `values` (any iterable of numbers).

    Raises ValueError when `values` is empty.
    """
    total = 0
    for value in values:
        total += value
    return total / (len(values) - 1)


def median(values):
    """Return the median of `values`; raise ValueError when it is empty."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("median() of empty data")
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2
