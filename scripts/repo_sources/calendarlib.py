"""calendarlib: date arithmetic from first principles."""

DESCRIPTION = "Proleptic Gregorian date arithmetic on (year, month, day) tuples, without the datetime module."

FILES = {
    "calendarlib/__init__.py": '''
"""Dates as (year, month, day) tuples."""

from calendarlib.dates import day_of_year, days_in_month, is_leap_year, is_valid, weekday
from calendarlib.arith import add_days, add_months, days_between, from_ordinal, to_ordinal

__all__ = [
    "add_days",
    "add_months",
    "day_of_year",
    "days_between",
    "days_in_month",
    "from_ordinal",
    "is_leap_year",
    "is_valid",
    "to_ordinal",
    "weekday",
]
''',
    "calendarlib/dates.py": '''
"""Facts about single dates."""

MONTH_DAYS = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]


def is_leap_year(year):
    """Gregorian leap-year rule."""
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def days_in_month(year, month):
    """Length of a month, February included."""
    if month < 1 or month > 12:
        raise ValueError("month must be 1..12")
    if month == 2 and is_leap_year(year):
        return 29
    return MONTH_DAYS[month - 1]


def is_valid(date):
    """Whether (year, month, day) names a real date."""
    year, month, day = date
    if month < 1 or month > 12:
        return False
    return 1 <= day <= days_in_month(year, month)


def day_of_year(date):
    """1 for January 1st."""
    year, month, day = date
    total = day
    for m in range(1, month):
        total += days_in_month(year, m)
    return total


def weekday(date):
    """0 = Monday ... 6 = Sunday (Zeller's congruence)."""
    year, month, day = date
    if month < 3:
        month += 12
        year -= 1
    k = year % 100
    j = year // 100
    h = (day + 13 * (month + 1) // 5 + k + k // 4 + j // 4 + 5 * j) % 7
    return (h + 5) % 7
''',
    "calendarlib/arith.py": '''
"""Moving between dates."""

from calendarlib.dates import days_in_month, is_leap_year, is_valid


def to_ordinal(date):
    """Days since 0001-01-01 (which is day 1)."""
    if not is_valid(date):
        raise ValueError(f"invalid date {date}")
    year, month, day = date
    y = year - 1
    days = y * 365 + y // 4 - y // 100 + y // 400
    for m in range(1, month):
        days += days_in_month(year, m)
    return days + day


def from_ordinal(ordinal):
    """Inverse of to_ordinal."""
    if ordinal < 1:
        raise ValueError("ordinal must be >= 1")
    year = 1
    while True:
        length = 366 if is_leap_year(year) else 365
        if ordinal <= length:
            break
        ordinal -= length
        year += 1
    month = 1
    while ordinal > days_in_month(year, month):
        ordinal -= days_in_month(year, month)
        month += 1
    return (year, month, ordinal)


def add_days(date, days):
    """The date `days` later (earlier if negative)."""
    return from_ordinal(to_ordinal(date) + days)


def days_between(a, b):
    """b - a in days."""
    return to_ordinal(b) - to_ordinal(a)


def add_months(date, months):
    """Same day `months` later, clamped to the target month's length."""
    year, month, day = date
    index = year * 12 + (month - 1) + months
    new_year, new_month = divmod(index, 12)
    new_month += 1
    return (new_year, new_month, min(day, days_in_month(new_year, new_month)))
''',
    "tests/test_dates.py": """
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
""",
    "tests/test_arith.py": """
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
""",
}
