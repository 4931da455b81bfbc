from polyarea import area, perimeter


def test_perimeter_square():
    assert perimeter([(0, 0), (2, 0), (2, 2), (0, 2)]) == 8.0


def test_degenerate():
    assert area([(0, 0), (1, 1)]) == 0.0
