"""Closed integer intervals as (start, end) tuples with start <= end."""

from intervals.core import contains, length, normalize, overlaps
from intervals.ops import coverage, gaps, insert, intersect, merge, subtract

__all__ = [
    "contains",
    "coverage",
    "gaps",
    "insert",
    "intersect",
    "length",
    "merge",
    "normalize",
    "overlaps",
    "subtract",
]
