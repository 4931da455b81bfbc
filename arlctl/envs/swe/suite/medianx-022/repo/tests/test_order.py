from medianx import median


def test_odd():
    assert median([5, 1, 3]) == 3


def test_single():
    assert median([7]) == 7
