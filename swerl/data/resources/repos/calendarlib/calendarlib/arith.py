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
