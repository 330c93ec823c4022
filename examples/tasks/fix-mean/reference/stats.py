"""Small statistics helpers used by the nightly reporting job."""


def mean(values):
    """Return the arithmetic mean of `values` (any iterable of numbers).

    Raises ValueError when `values` is empty.
    """
    total = 0
    count = 0
    for value in values:
        total += value
        count += 1
    if count == 0:
        raise ValueError("mean() of empty data")
    return total / count


def median(values):
    """Return the median of `values`; raise ValueError when it is empty."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("median() of empty data")
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2
