import pytest

from calendarlib import day_of_year, days_in_month, is_leap_year, is_valid, weekday


@pytest.mark.parametrize("year,leap", [(2024, True), (2023, False), (1900, False), (2000, True)])
def test_is_leap_year(year, leap):
    assert is_leap_year(year) is leap


def test_days_in_february_leap():
    assert days_in_month(2024, 2) == 29


def test_days_in_february_common():
    assert days_in_month(2023, 2) == 28


def test_days_in_december():
    assert days_in_month(2023, 12) == 31


def test_days_in_month_rejects_13():
    with pytest.raises(ValueError):
        days_in_month(2023, 13)


def test_is_valid():
    assert is_valid((2024, 2, 29)) and not is_valid((2023, 2, 29)) and not is_valid((2023, 4, 0))


def test_day_of_year():
    assert day_of_year((2023, 3, 1)) == 60


def test_day_of_year_leap():
    assert day_of_year((2024, 12, 31)) == 366


@pytest.mark.parametrize("date,expected", [((2024, 1, 1), 0), ((2000, 2, 29), 1), ((1970, 1, 1), 3), ((2023, 12, 31), 6)])
def test_weekday(date, expected):
    assert weekday(date) == expected
