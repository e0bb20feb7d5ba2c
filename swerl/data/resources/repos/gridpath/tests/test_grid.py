import pytest

from gridpath import Grid, parse

MAZE = """
S..#
.#..
...G
"""


def test_parse_dimensions():
    g = parse(MAZE)
    assert (g.height, g.width) == (3, 4)


def test_ragged_grid_rejected():
    with pytest.raises(ValueError):
        Grid(["..", "."])


def test_empty_grid_rejected():
    with pytest.raises(ValueError):
        Grid([])


def test_in_bounds_edges():
    g = parse(MAZE)
    assert g.in_bounds((2, 3)) and not g.in_bounds((3, 0)) and not g.in_bounds((0, -1))


def test_wall_not_open():
    assert not parse(MAZE).is_open((0, 3))


def test_neighbours_corner():
    assert parse(MAZE).neighbours((0, 0)) == [(1, 0), (0, 1)]


def test_neighbours_diagonal():
    assert parse(MAZE).neighbours((0, 0), diagonal=True) == [(1, 0), (0, 1)]


def test_neighbours_middle():
    assert parse(MAZE).neighbours((1, 2)) == [(0, 2), (2, 2), (1, 3)]


def test_find():
    assert parse(MAZE).find("G") == (2, 3)


def test_find_missing():
    assert parse(MAZE).find("X") is None
