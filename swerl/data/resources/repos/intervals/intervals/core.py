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
