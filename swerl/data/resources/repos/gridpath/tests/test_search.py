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
    assert shortest_path_length(parse("...\n...\n..."), (0, 0), (2, 2), diagonal=True) == 2


def test_reachable_count():
    assert len(reachable(CLOSED, (0, 0))) == 4


def test_reachable_from_wall():
    assert reachable(CLOSED, (0, 2)) == set()


def test_flood_fill():
    assert flood_fill(CLOSED, (0, 0), "~") == ["~~#.", "~~#."]
