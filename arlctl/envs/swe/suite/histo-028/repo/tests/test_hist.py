from histo import histogram


def test_constant():
    assert histogram([3, 3, 3], bins=3) == [3, 0, 0]


def test_empty():
    assert histogram([], bins=2) == [0, 0]
