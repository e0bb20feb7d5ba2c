"""statskit: descriptive statistics."""

DESCRIPTION = "Descriptive statistics: mean, median, variance, percentiles, histograms."

FILES = {
    "statskit/__init__.py": '''
"""Descriptive statistics on plain lists."""

from statskit.central import mean, median, mode, weighted_mean
from statskit.spread import histogram, percentile, stdev, value_range, variance, zscores

__all__ = [
    "histogram",
    "mean",
    "median",
    "mode",
    "percentile",
    "stdev",
    "value_range",
    "variance",
    "weighted_mean",
    "zscores",
]
''',
    "statskit/central.py": '''
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
''',
    "statskit/spread.py": '''
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
''',
    "tests/test_central.py": """
import pytest

from statskit import mean, median, mode, weighted_mean


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5


def test_mean_empty():
    with pytest.raises(ValueError):
        mean([])


def test_weighted_mean():
    assert weighted_mean([1, 3], [3, 1]) == 1.5


def test_weighted_mean_length_mismatch():
    with pytest.raises(ValueError):
        weighted_mean([1, 2], [1])


def test_weighted_mean_zero_weights():
    with pytest.raises(ValueError):
        weighted_mean([1, 2], [0, 0])


def test_median_odd():
    assert median([5, 1, 3]) == 3


def test_median_even():
    assert median([4, 1, 3, 2]) == 2.5


def test_median_single():
    assert median([7]) == 7


def test_mode():
    assert mode([1, 2, 2, 3, 3, 3]) == 3


def test_mode_tie_takes_smallest():
    assert mode([4, 4, 1, 1, 9]) == 1
""",
    "tests/test_spread.py": """
import math

import pytest

from statskit import histogram, percentile, stdev, value_range, variance, zscores

DATA = [2, 4, 4, 4, 5, 5, 7, 9]


def test_population_variance():
    assert variance(DATA, sample=False) == 4


def test_sample_variance():
    assert math.isclose(variance(DATA), 32 / 7)


def test_sample_variance_needs_two():
    with pytest.raises(ValueError):
        variance([1])


def test_population_stdev():
    assert stdev(DATA, sample=False) == 2


def test_value_range():
    assert value_range([3, -1, 8]) == 9


@pytest.mark.parametrize("p,expected", [(0, 1), (50, 3), (100, 5), (25, 2), (90, 4.6)])
def test_percentile(p, expected):
    assert math.isclose(percentile([5, 1, 4, 2, 3], p), expected)


def test_percentile_out_of_range():
    with pytest.raises(ValueError):
        percentile([1, 2], 101)


def test_zscores():
    assert zscores([2, 4, 4, 4, 5, 5, 7, 9])[0] == -1.5


def test_zscores_constant():
    assert zscores([3, 3]) == [0.0, 0.0]


def test_histogram():
    assert histogram([0, 1, 2, 3, 4, 9.99, 10, -1], 2, 0, 10) == [5, 1]


def test_histogram_rejects_zero_bins():
    with pytest.raises(ValueError):
        histogram([1], 0, 0, 1)
""",
}
