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
