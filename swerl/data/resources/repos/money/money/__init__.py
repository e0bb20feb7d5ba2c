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
