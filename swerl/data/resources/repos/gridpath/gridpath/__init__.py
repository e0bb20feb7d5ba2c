"""Grids of characters: '#' is a wall, anything else is open."""

from gridpath.grid import Grid, parse
from gridpath.search import flood_fill, reachable, shortest_path, shortest_path_length

__all__ = ["Grid", "flood_fill", "parse", "reachable", "shortest_path", "shortest_path_length"]
