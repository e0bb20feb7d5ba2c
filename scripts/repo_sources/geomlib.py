"""geomlib: 2D geometry."""

DESCRIPTION = "2D geometry: points, segments, polygons, bounding boxes."

FILES = {
    "geomlib/__init__.py": '''
"""2D geometry on (x, y) tuples."""

from geomlib.points import distance, manhattan, midpoint, orientation, rotate90
from geomlib.shapes import bounding_box, contains_point, perimeter, polygon_area, segments_intersect

__all__ = [
    "bounding_box",
    "contains_point",
    "distance",
    "manhattan",
    "midpoint",
    "orientation",
    "perimeter",
    "polygon_area",
    "rotate90",
    "segments_intersect",
]
''',
    "geomlib/points.py": '''
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
''',
    "geomlib/shapes.py": '''
"""Polygons, boxes and segments."""

from geomlib.points import distance, orientation


def polygon_area(vertices):
    """Area of a simple polygon (shoelace formula); vertices in either order."""
    if len(vertices) < 3:
        return 0.0
    total = 0.0
    for i in range(len(vertices)):
        x1, y1 = vertices[i]
        x2, y2 = vertices[(i + 1) % len(vertices)]
        total += x1 * y2 - x2 * y1
    return abs(total) / 2


def perimeter(vertices):
    """Length of the closed polygon's boundary."""
    if len(vertices) < 2:
        return 0.0
    return sum(distance(vertices[i - 1], vertices[i]) for i in range(len(vertices)))


def bounding_box(points):
    """(min_x, min_y, max_x, max_y) of a non-empty point set."""
    if not points:
        raise ValueError("no points")
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    return (min(xs), min(ys), max(xs), max(ys))


def contains_point(box, p, inclusive=True):
    """Whether box (min_x, min_y, max_x, max_y) contains p; edges count when inclusive."""
    min_x, min_y, max_x, max_y = box
    if inclusive:
        return min_x <= p[0] <= max_x and min_y <= p[1] <= max_y
    return min_x < p[0] < max_x and min_y < p[1] < max_y


def _on_segment(a, b, p):
    return min(a[0], b[0]) <= p[0] <= max(a[0], b[0]) and min(a[1], b[1]) <= p[1] <= max(a[1], b[1])


def segments_intersect(a, b, c, d):
    """Whether segment ab meets segment cd (touching counts)."""
    o1 = orientation(a, b, c)
    o2 = orientation(a, b, d)
    o3 = orientation(c, d, a)
    o4 = orientation(c, d, b)
    if o1 != o2 and o3 != o4:
        return True
    if o1 == 0 and _on_segment(a, b, c):
        return True
    if o2 == 0 and _on_segment(a, b, d):
        return True
    if o3 == 0 and _on_segment(c, d, a):
        return True
    if o4 == 0 and _on_segment(c, d, b):
        return True
    return False
''',
    "tests/test_points.py": """
import math

from geomlib import distance, manhattan, midpoint, orientation, rotate90


def test_distance():
    assert distance((0, 0), (3, 4)) == 5


def test_distance_negative_coordinates():
    assert math.isclose(distance((-1, -1), (2, 3)), 5)


def test_manhattan():
    assert manhattan((1, 2), (4, -2)) == 7


def test_midpoint():
    assert midpoint((0, 0), (4, 2)) == (2, 1)


def test_rotate90_counter_clockwise():
    assert rotate90((1, 2)) == (-2, 1)


def test_rotate90_clockwise():
    assert rotate90((1, 2), clockwise=True) == (2, -1)


def test_orientation_left_turn():
    assert orientation((0, 0), (1, 0), (1, 1)) == 1


def test_orientation_right_turn():
    assert orientation((0, 0), (1, 0), (1, -1)) == -1


def test_orientation_collinear():
    assert orientation((0, 0), (1, 1), (2, 2)) == 0
""",
    "tests/test_shapes.py": """
import pytest

from geomlib import bounding_box, contains_point, perimeter, polygon_area, segments_intersect

SQUARE = [(0, 0), (2, 0), (2, 2), (0, 2)]


def test_polygon_area_square():
    assert polygon_area(SQUARE) == 4


def test_polygon_area_clockwise_order():
    assert polygon_area(list(reversed(SQUARE))) == 4


def test_polygon_area_triangle():
    assert polygon_area([(0, 0), (4, 0), (0, 3)]) == 6


def test_polygon_area_degenerate():
    assert polygon_area([(0, 0), (1, 1)]) == 0


def test_perimeter_square():
    assert perimeter(SQUARE) == 8


def test_perimeter_triangle():
    assert perimeter([(0, 0), (3, 0), (3, 4)]) == 12


def test_bounding_box():
    assert bounding_box([(1, 5), (-2, 3), (4, -1)]) == (-2, -1, 4, 5)


def test_bounding_box_empty():
    with pytest.raises(ValueError):
        bounding_box([])


def test_contains_point_inside():
    assert contains_point((0, 0, 2, 2), (1, 1))


def test_contains_point_edge_inclusive():
    assert contains_point((0, 0, 2, 2), (2, 1))


def test_contains_point_edge_exclusive():
    assert not contains_point((0, 0, 2, 2), (2, 1), inclusive=False)


def test_contains_point_outside():
    assert not contains_point((0, 0, 2, 2), (3, 1))


def test_segments_cross():
    assert segments_intersect((0, 0), (2, 2), (0, 2), (2, 0))


def test_segments_parallel():
    assert not segments_intersect((0, 0), (2, 0), (0, 1), (2, 1))


def test_segments_touch_at_end():
    assert segments_intersect((0, 0), (1, 1), (1, 1), (2, 0))


def test_segments_collinear_disjoint():
    assert not segments_intersect((0, 0), (1, 0), (2, 0), (3, 0))
""",
}
