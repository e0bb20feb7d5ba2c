from intervals import contains, length, normalize, overlaps


def test_normalize_swaps():
    assert normalize((5, 2)) == (2, 5)


def test_normalize_keeps_order():
    assert normalize((2, 5)) == (2, 5)


def test_length():
    assert length((3, 7)) == 5


def test_length_single_point():
    assert length((4, 4)) == 1


def test_overlaps_shared_endpoint():
    assert overlaps((1, 3), (3, 5))


def test_overlaps_disjoint():
    assert not overlaps((1, 2), (3, 4))


def test_contains_bounds():
    assert contains((1, 3), 1) and contains((1, 3), 3)


def test_contains_outside():
    assert not contains((1, 3), 4)
