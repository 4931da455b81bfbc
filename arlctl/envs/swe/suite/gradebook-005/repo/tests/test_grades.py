import pytest

from gradebook import letter, weighted_average


def test_letters():
    assert [letter(s) for s in (95, 90, 85, 60, 10)] == ["A", "A", "B", "D", "F"]


def test_fractional_weights():
    assert weighted_average([100, 50], [0.5, 0.5]) == 75.0


def test_mismatch():
    with pytest.raises(ValueError):
        weighted_average([1], [1, 2])
