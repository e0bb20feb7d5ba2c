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
