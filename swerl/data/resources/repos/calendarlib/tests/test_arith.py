import pytest

from calendarlib import add_days, add_months, days_between, from_ordinal, to_ordinal


def test_to_ordinal_epoch():
    assert to_ordinal((1, 1, 1)) == 1


def test_to_ordinal_known():
    assert to_ordinal((2000, 1, 1)) == 730120


def test_to_ordinal_invalid():
    with pytest.raises(ValueError):
        to_ordinal((2023, 2, 30))


@pytest.mark.parametrize("date", [(1, 1, 1), (1999, 12, 31), (2000, 2, 29), (2023, 7, 15)])
def test_ordinal_round_trip(date):
    assert from_ordinal(to_ordinal(date)) == date


def test_add_days_across_year():
    assert add_days((2023, 12, 30), 3) == (2024, 1, 2)


def test_add_days_negative():
    assert add_days((2024, 3, 1), -1) == (2024, 2, 29)


def test_days_between():
    assert days_between((2024, 1, 1), (2025, 1, 1)) == 366


def test_add_months_clamps():
    assert add_months((2024, 1, 31), 1) == (2024, 2, 29)


def test_add_months_across_year():
    assert add_months((2023, 11, 15), 3) == (2024, 2, 15)


def test_add_months_backwards():
    assert add_months((2024, 1, 15), -1) == (2023, 12, 15)
