"""Measures of spread and position."""

from statskit.central import mean


def variance(values, sample=True):
    """Sample (n - 1) or population (n) variance."""
    n = len(values)
    if n < 2 and sample:
        raise ValueError("sample variance needs at least two values")
    if n == 0:
        raise ValueError("variance of empty data")
    m = mean(values)
    squares = sum((v - m) ** 2 for v in values)
    return squares / (n - 1) if sample else squares / n


def stdev(values, sample=True):
    """Square root of the variance."""
    return variance(values, sample) ** 0.5


def value_range(values):
    """max - min."""
    if not values:
        raise ValueError("range of empty data")
    return max(values) - min(values)


def percentile(values, p):
    """Linear-interpolated percentile, p in [0, 100]."""
    if not values:
        raise ValueError("percentile of empty data")
    if p < 0 or p > 100:
        raise ValueError("p must be within [0, 100]")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    fraction = rank - low
    return ordered[low] + (ordered[high] - ordered[low]) * fraction


def zscores(values):
    """Each value's distance from the mean in population standard deviations."""
    m = mean(values)
    s = stdev(values, sample=False)
    if s == 0:
        return [0.0 for _ in values]
    return [(v - m) / s for v in values]


def histogram(values, bins, low, high):
    """Counts of values in `bins` equal-width bins over [low, high); out-of-range values are ignored."""
    if bins < 1:
        raise ValueError("bins must be >= 1")
    width = (high - low) / bins
    counts = [0] * bins
    for v in values:
        if v < low or v >= high:
            continue
        index = int((v - low) // width)
        counts[index] += 1
    return counts
