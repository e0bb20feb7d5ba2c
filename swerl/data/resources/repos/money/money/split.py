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
