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
