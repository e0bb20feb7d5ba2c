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
