"""Measures of central tendency."""


def mean(values):
    """Arithmetic mean of a non-empty list."""
    if not values:
        raise ValueError("mean of empty data")
    return sum(values) / len(values)


def weighted_mean(values, weights):
    """Mean of values weighted by non-negative weights."""
    if len(values) != len(weights):
        raise ValueError("values and weights differ in length")
    total_weight = sum(weights)
    if total_weight <= 0:
        raise ValueError("weights must sum to a positive number")
    return sum(v * w for v, w in zip(values, weights)) / total_weight


def median(values):
    """Middle value; the mean of the two middle values for even-length data."""
    if not values:
        raise ValueError("median of empty data")
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    if n % 2 == 1:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2


def mode(values):
    """Most common value; the smallest one on ties."""
    if not values:
        raise ValueError("mode of empty data")
    counts = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    best = None
    for v in sorted(counts):
        if best is None or counts[v] > counts[best]:
            best = v
    return best
