from spans import merge, overlaps


def test_sorted_input():
    assert merge([(1, 3), (2, 4), (6, 8)]) == [(1, 4), (6, 8)]


def test_touching():
    assert overlaps((1, 2), (2, 3))
