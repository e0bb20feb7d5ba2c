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
