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
