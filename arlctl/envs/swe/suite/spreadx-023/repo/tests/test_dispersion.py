from spreadx import stdev, variance


def test_population():
    assert stdev([2, 4, 4, 4, 5, 5, 7, 9], ddof=0) == 2.0


def test_sample_variance():
    assert variance([1, 2, 3, 4]) == 5 / 3
