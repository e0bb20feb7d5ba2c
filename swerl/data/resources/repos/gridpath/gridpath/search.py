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
