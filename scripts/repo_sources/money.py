"""money: currency arithmetic in integer cents."""

DESCRIPTION = "Currency arithmetic in integer minor units: parsing, formatting, rounding, allocation."

FILES = {
    "money/__init__.py": '''
"""Money as integer minor units (cents)."""

from money.amounts import add, format_amount, multiply, parse_amount, percent_of, round_half_even
from money.split import allocate, apply_discount, compound, split_evenly

__all__ = [
    "add",
    "allocate",
    "apply_discount",
    "compound",
    "format_amount",
    "multiply",
    "parse_amount",
    "percent_of",
    "round_half_even",
    "split_evenly",
]
''',
    "money/amounts.py": '''
"""Parsing, formatting and basic arithmetic."""


def round_half_even(numerator, denominator):
    """numerator / denominator rounded to an integer, ties to even (banker's rounding)."""
    if denominator <= 0:
        raise ValueError("denominator must be positive")
    quotient, remainder = divmod(numerator, denominator)
    twice = 2 * remainder
    if twice > denominator or (twice == denominator and quotient % 2 == 1):
        quotient += 1
    return quotient


def parse_amount(text):
    """'12.34' -> 1234 cents; '-0.5' -> -50; at most two decimals."""
    text = text.strip()
    negative = text.startswith("-")
    if negative:
        text = text[1:]
    whole, _, frac = text.partition(".")
    if len(frac) > 2 or not (whole or frac):
        raise ValueError(f"bad amount: {text!r}")
    cents = int(whole or "0") * 100 + int(frac.ljust(2, "0") or "0")
    return -cents if negative else cents


def format_amount(cents, symbol="$"):
    """1234567 -> '$12,345.67' (thousands separated)."""
    sign = "-" if cents < 0 else ""
    whole, frac = divmod(abs(cents), 100)
    digits = str(whole)
    groups = []
    while len(digits) > 3:
        groups.insert(0, digits[-3:])
        digits = digits[:-3]
    groups.insert(0, digits)
    return f"{sign}{symbol}{','.join(groups)}.{frac:02d}"


def add(*amounts):
    """Sum of amounts in cents."""
    total = 0
    for amount in amounts:
        total += amount
    return total


def multiply(cents, factor_numerator, factor_denominator=1):
    """cents * (numerator / denominator), rounded half-even."""
    return round_half_even(cents * factor_numerator, factor_denominator)


def percent_of(cents, percent):
    """`percent` percent of an amount, rounded half-even."""
    return round_half_even(cents * percent, 100)
''',
    "money/split.py": '''
"""Splitting and growing amounts without losing cents."""

from money.amounts import percent_of, round_half_even


def split_evenly(cents, parts):
    """Split into `parts` amounts differing by at most one cent, larger ones first."""
    if parts <= 0:
        raise ValueError("parts must be positive")
    base, extra = divmod(cents, parts)
    return [base + 1 if i < extra else base for i in range(parts)]


def allocate(cents, ratios):
    """Split by integer ratios; leftover cents go to the earliest shares."""
    total = sum(ratios)
    if total <= 0:
        raise ValueError("ratios must sum to a positive number")
    shares = [cents * r // total for r in ratios]
    leftover = cents - sum(shares)
    for i in range(leftover):
        shares[i % len(shares)] += 1
    return shares


def apply_discount(cents, percent, minimum=0):
    """Price after a percentage discount, never below `minimum`."""
    if percent < 0 or percent > 100:
        raise ValueError("percent must be within [0, 100]")
    discounted = cents - percent_of(cents, percent)
    return max(discounted, minimum)


def compound(cents, rate_percent, periods):
    """Balance after `periods` of compounding at rate_percent, rounding each period."""
    balance = cents
    for _ in range(periods):
        balance = balance + round_half_even(balance * rate_percent, 100)
    return balance
''',
    "tests/test_amounts.py": """
import pytest

from money import add, format_amount, multiply, parse_amount, percent_of, round_half_even


@pytest.mark.parametrize("num,den,expected", [(5, 2, 2), (7, 2, 4), (6, 4, 2), (7, 4, 2), (9, 4, 2), (-5, 2, -2)])
def test_round_half_even(num, den, expected):
    assert round_half_even(num, den) == expected


def test_round_half_even_bad_denominator():
    with pytest.raises(ValueError):
        round_half_even(1, 0)


@pytest.mark.parametrize("text,cents", [("12.34", 1234), ("5", 500), ("0.5", 50), ("-1.05", -105), (".07", 7)])
def test_parse_amount(text, cents):
    assert parse_amount(text) == cents


def test_parse_amount_too_many_decimals():
    with pytest.raises(ValueError):
        parse_amount("1.234")


def test_format_amount():
    assert format_amount(1234567) == "$12,345.67"


def test_format_amount_small_and_negative():
    assert format_amount(-5, symbol="EUR ") == "-EUR 0.05"


def test_format_amount_exact_thousand():
    assert format_amount(100000) == "$1,000.00"


def test_add():
    assert add(100, 250, -50) == 300


def test_multiply_rounds():
    assert multiply(105, 1, 2) == 52


def test_percent_of():
    assert percent_of(1999, 15) == 300
""",
    "tests/test_split.py": """
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
""",
}
