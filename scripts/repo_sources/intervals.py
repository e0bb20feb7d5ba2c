"""intervals: closed integer intervals."""

DESCRIPTION = "Closed integer intervals: merging, intersection, gaps, coverage."

FILES = {
    "intervals/__init__.py": '''
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
''',
    "intervals/core.py": '''
"""Single-interval predicates."""


def normalize(interval):
    """(a, b) with a <= b."""
    start, end = interval
    if start > end:
        return (end, start)
    return (start, end)


def length(interval):
    """Number of integers in the closed interval."""
    start, end = interval
    return end - start + 1


def overlaps(a, b):
    """Whether two closed intervals share at least one integer."""
    return a[0] <= b[1] and b[0] <= a[1]


def contains(interval, value):
    """Whether value lies in the closed interval."""
    return interval[0] <= value <= interval[1]
''',
    "intervals/ops.py": '''
"""Operations on lists of intervals."""

from intervals.core import length, normalize, overlaps


def merge(intervals, join_adjacent=True):
    """Sorted, non-overlapping union; (1, 2) and (3, 4) join when join_adjacent."""
    ordered = sorted(normalize(i) for i in intervals)
    merged = []
    for start, end in ordered:
        gap = 1 if join_adjacent else 0
        if merged and start <= merged[-1][1] + gap:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def intersect(a, b):
    """The overlap of two intervals, or None."""
    if not overlaps(a, b):
        return None
    return (max(a[0], b[0]), min(a[1], b[1]))


def insert(intervals, new):
    """Merge one interval into a list."""
    return merge(list(intervals) + [new])


def gaps(intervals, low, high):
    """Integer ranges within [low, high] covered by no interval."""
    result = []
    cursor = low
    for start, end in merge(intervals):
        if end < low or start > high:
            continue
        if start > cursor:
            result.append((cursor, start - 1))
        cursor = max(cursor, end + 1)
    if cursor <= high:
        result.append((cursor, high))
    return result


def coverage(intervals):
    """How many integers the union covers."""
    return sum(length(i) for i in merge(intervals))


def subtract(a, b):
    """Parts of interval a not in interval b (0, 1 or 2 intervals)."""
    if not overlaps(a, b):
        return [a]
    pieces = []
    if a[0] < b[0]:
        pieces.append((a[0], b[0] - 1))
    if a[1] > b[1]:
        pieces.append((b[1] + 1, a[1]))
    return pieces
''',
    "tests/test_core.py": """
from intervals import contains, length, normalize, overlaps


def test_normalize_swaps():
    assert normalize((5, 2)) == (2, 5)


def test_normalize_keeps_order():
    assert normalize((2, 5)) == (2, 5)


def test_length():
    assert length((3, 7)) == 5


def test_length_single_point():
    assert length((4, 4)) == 1


def test_overlaps_shared_endpoint():
    assert overlaps((1, 3), (3, 5))


def test_overlaps_disjoint():
    assert not overlaps((1, 2), (3, 4))


def test_contains_bounds():
    assert contains((1, 3), 1) and contains((1, 3), 3)


def test_contains_outside():
    assert not contains((1, 3), 4)
""",
    "tests/test_ops.py": """
from intervals import coverage, gaps, insert, intersect, merge, subtract


def test_merge_overlapping():
    assert merge([(1, 3), (2, 6), (8, 10)]) == [(1, 6), (8, 10)]


def test_merge_adjacent_joined():
    assert merge([(1, 2), (3, 4)]) == [(1, 4)]


def test_merge_adjacent_kept_apart():
    assert merge([(1, 2), (3, 4)], join_adjacent=False) == [(1, 2), (3, 4)]


def test_merge_unsorted_and_reversed():
    assert merge([(9, 7), (1, 2)]) == [(1, 2), (7, 9)]


def test_merge_nested():
    assert merge([(1, 10), (2, 3)]) == [(1, 10)]


def test_intersect():
    assert intersect((1, 5), (3, 8)) == (3, 5)


def test_intersect_none():
    assert intersect((1, 2), (4, 5)) is None


def test_insert():
    assert insert([(1, 2), (6, 7)], (3, 5)) == [(1, 7)]


def test_gaps():
    assert gaps([(2, 3), (6, 7)], 0, 9) == [(0, 1), (4, 5), (8, 9)]


def test_gaps_full_cover():
    assert gaps([(0, 9)], 0, 9) == []


def test_gaps_ignores_outside():
    assert gaps([(20, 30)], 0, 4) == [(0, 4)]


def test_coverage():
    assert coverage([(1, 3), (2, 5), (10, 10)]) == 6


def test_subtract_middle():
    assert subtract((1, 10), (4, 6)) == [(1, 3), (7, 10)]


def test_subtract_disjoint():
    assert subtract((1, 3), (5, 6)) == [(1, 3)]


def test_subtract_everything():
    assert subtract((2, 3), (1, 5)) == []
""",
}
