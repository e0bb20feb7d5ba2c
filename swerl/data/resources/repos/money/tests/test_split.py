import pytest

from money import allocate, apply_discount, compound, split_evenly


def test_split_evenly():
    assert split_evenly(100, 3) == [34, 33, 33]


def test_split_evenly_exact():
    assert split_evenly(90, 3) == [30, 30, 30]


def test_split_evenly_rejects_zero():
    with pytest.raises(ValueError):
        split_evenly(10, 0)


def test_allocate_keeps_every_cent():
    shares = allocate(1001, [1, 1, 1])
    assert shares == [334, 334, 333] and sum(shares) == 1001


def test_allocate_ratios():
    assert allocate(100, [3, 1]) == [75, 25]


def test_apply_discount():
    assert apply_discount(2000, 25) == 1500


def test_apply_discount_minimum():
    assert apply_discount(2000, 90, minimum=500) == 500


def test_apply_discount_rejects_bad_percent():
    with pytest.raises(ValueError):
        apply_discount(100, 120)


def test_compound():
    assert compound(10000, 10, 2) == 12100


def test_compound_zero_periods():
    assert compound(10000, 10, 0) == 10000
