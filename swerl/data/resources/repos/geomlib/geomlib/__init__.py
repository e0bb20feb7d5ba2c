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
