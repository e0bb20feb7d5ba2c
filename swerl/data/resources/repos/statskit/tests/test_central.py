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
