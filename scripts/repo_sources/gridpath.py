"""gridpath: grids and breadth-first search."""

DESCRIPTION = "Character grids: parsing, neighbours, BFS shortest paths, flood fill."

FILES = {
    "gridpath/__init__.py": '''
"""Grids of characters: '#' is a wall, anything else is open."""

from gridpath.grid import Grid, parse
from gridpath.search import flood_fill, reachable, shortest_path, shortest_path_length

__all__ = ["Grid", "flood_fill", "parse", "reachable", "shortest_path", "shortest_path_length"]
''',
    "gridpath/grid.py": '''
"""The grid type."""

WALL = "#"


class Grid:
    """A rectangular grid of characters."""

    def __init__(self, rows):
        if not rows:
            raise ValueError("empty grid")
        width = len(rows[0])
        for row in rows:
            if len(row) != width:
                raise ValueError("ragged grid")
        self.rows = list(rows)
        self.height = len(rows)
        self.width = width

    def in_bounds(self, cell):
        r, c = cell
        return 0 <= r < self.height and 0 <= c < self.width

    def is_open(self, cell):
        return self.in_bounds(cell) and self.rows[cell[0]][cell[1]] != WALL

    def neighbours(self, cell, diagonal=False):
        """Open cells next to `cell`, in a fixed order (up, down, left, right, then diagonals)."""
        r, c = cell
        steps = [(-1, 0), (1, 0), (0, -1), (0, 1)]
        if diagonal:
            steps += [(-1, -1), (-1, 1), (1, -1), (1, 1)]
        return [(r + dr, c + dc) for dr, dc in steps if self.is_open((r + dr, c + dc))]

    def find(self, char):
        """First cell holding `char`, scanning rows top to bottom."""
        for r in range(self.height):
            for c in range(self.width):
                if self.rows[r][c] == char:
                    return (r, c)
        return None


def parse(text):
    """Grid from newline-separated rows (blank lines ignored)."""
    return Grid([line for line in text.splitlines() if line.strip()])
''',
    "gridpath/search.py": '''
"""Searches over a grid."""

from collections import deque


def _bfs(grid, start, diagonal=False):
    parents = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        for nxt in grid.neighbours(cell, diagonal):
            if nxt not in parents:
                parents[nxt] = cell
                queue.append(nxt)
    return parents


def shortest_path(grid, start, goal, diagonal=False):
    """Cells from start to goal inclusive along a shortest path, or None."""
    if not grid.is_open(start) or not grid.is_open(goal):
        return None
    parents = _bfs(grid, start, diagonal)
    if goal not in parents:
        return None
    path = [goal]
    while path[-1] != start:
        path.append(parents[path[-1]])
    path.reverse()
    return path


def shortest_path_length(grid, start, goal, diagonal=False):
    """Number of steps on a shortest path, or -1 when unreachable."""
    path = shortest_path(grid, start, goal, diagonal)
    if path is None:
        return -1
    return len(path) - 1


def reachable(grid, start):
    """Every open cell reachable from start (including start)."""
    if not grid.is_open(start):
        return set()
    return set(_bfs(grid, start))


def flood_fill(grid, start, char):
    """Rows with every cell reachable from start replaced by `char`."""
    cells = reachable(grid, start)
    rows = []
    for r in range(grid.height):
        row = "".join(char if (r, c) in cells else grid.rows[r][c] for c in range(grid.width))
        rows.append(row)
    return rows
''',
    "tests/test_grid.py": '''
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
''',
    "tests/test_search.py": '''
from gridpath import flood_fill, parse, reachable, shortest_path, shortest_path_length

MAZE = parse("""
S..#
.#..
...G
""")

CLOSED = parse("""
S.#.
..#.
""")


def test_shortest_path_length():
    assert shortest_path_length(MAZE, (0, 0), (2, 3)) == 5


def test_shortest_path_endpoints():
    path = shortest_path(MAZE, (0, 0), (2, 3))
    assert path[0] == (0, 0) and path[-1] == (2, 3) and len(path) == 6


def test_shortest_path_steps_are_adjacent():
    path = shortest_path(MAZE, (0, 0), (2, 3))
    assert all(abs(a[0] - b[0]) + abs(a[1] - b[1]) == 1 for a, b in zip(path, path[1:]))


def test_shortest_path_same_cell():
    assert shortest_path(MAZE, (0, 0), (0, 0)) == [(0, 0)]


def test_unreachable():
    assert shortest_path_length(CLOSED, (0, 0), (0, 3)) == -1


def test_goal_is_wall():
    assert shortest_path(MAZE, (0, 0), (0, 3)) is None


def test_diagonal_shortcut():
    assert shortest_path_length(parse("...\\n...\\n..."), (0, 0), (2, 2), diagonal=True) == 2


def test_reachable_count():
    assert len(reachable(CLOSED, (0, 0))) == 4


def test_reachable_from_wall():
    assert reachable(CLOSED, (0, 2)) == set()


def test_flood_fill():
    assert flood_fill(CLOSED, (0, 0), "~") == ["~~#.", "~~#."]
''',
}
