"""Operations on points."""

import math


def distance(p, q):
    """Euclidean distance."""
    return math.hypot(q[0] - p[0], q[1] - p[1])


def manhattan(p, q):
    """Taxicab distance."""
    return abs(q[0] - p[0]) + abs(q[1] - p[1])


def midpoint(p, q):
    """Point halfway between p and q."""
    return ((p[0] + q[0]) / 2, (p[1] + q[1]) / 2)


def rotate90(p, clockwise=False):
    """Rotate a point a quarter turn about the origin."""
    x, y = p
    if clockwise:
        return (y, -x)
    return (-y, x)


def orientation(a, b, c):
    """1 if a->b->c turns counter-clockwise, -1 if clockwise, 0 if collinear."""
    cross = (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])
    if cross > 0:
        return 1
    if cross < 0:
        return -1
    return 0
