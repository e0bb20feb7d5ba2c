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
