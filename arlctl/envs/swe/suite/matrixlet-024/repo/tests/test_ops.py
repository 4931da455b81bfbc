from matrixlet import matmul, transpose


def test_square_transpose():
    assert transpose([[1, 2], [3, 4]]) == [[1, 3], [2, 4]]


def test_square_matmul():
    assert matmul([[1, 2], [3, 4]], [[1, 0], [0, 1]]) == [[1, 2], [3, 4]]
