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
