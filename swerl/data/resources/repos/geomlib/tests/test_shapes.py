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
