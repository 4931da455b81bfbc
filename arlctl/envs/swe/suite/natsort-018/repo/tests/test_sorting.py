from natsort_lite import natural_sorted


def test_text_only():
    assert natural_sorted(["b", "A", "c"]) == ["A", "b", "c"]


def test_same_width_numbers():
    assert natural_sorted(["x3", "x1", "x2"]) == ["x1", "x2", "x3"]
