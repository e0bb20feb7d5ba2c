from intervals import coverage, gaps, insert, intersect, merge, subtract


def test_merge_overlapping():
    assert merge([(1, 3), (2, 6), (8, 10)]) == [(1, 6), (8, 10)]


def test_merge_adjacent_joined():
    assert merge([(1, 2), (3, 4)]) == [(1, 4)]


def test_merge_adjacent_kept_apart():
    assert merge([(1, 2), (3, 4)], join_adjacent=False) == [(1, 2), (3, 4)]


def test_merge_unsorted_and_reversed():
    assert merge([(9, 7), (1, 2)]) == [(1, 2), (7, 9)]


def test_merge_nested():
    assert merge([(1, 10), (2, 3)]) == [(1, 10)]


def test_intersect():
    assert intersect((1, 5), (3, 8)) == (3, 5)


def test_intersect_none():
    assert intersect((1, 2), (4, 5)) is None


def test_insert():
    assert insert([(1, 2), (6, 7)], (3, 5)) == [(1, 7)]


def test_gaps():
    assert gaps([(2, 3), (6, 7)], 0, 9) == [(0, 1), (4, 5), (8, 9)]


def test_gaps_full_cover():
    assert gaps([(0, 9)], 0, 9) == []


def test_gaps_ignores_outside():
    assert gaps([(20, 30)], 0, 4) == [(0, 4)]


def test_coverage():
    assert coverage([(1, 3), (2, 5), (10, 10)]) == 6


def test_subtract_middle():
    assert subtract((1, 10), (4, 6)) == [(1, 3), (7, 10)]


def test_subtract_disjoint():
    assert subtract((1, 3), (5, 6)) == [(1, 3)]


def test_subtract_everything():
    assert subtract((2, 3), (1, 5)) == []
