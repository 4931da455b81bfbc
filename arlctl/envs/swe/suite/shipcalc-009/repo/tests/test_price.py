import pytest

from shipcalc import price_for


def test_light():
    assert price_for(0.3) == 4.0


def test_middle():
    assert price_for(3) == 7.5


def test_too_heavy():
    with pytest.raises(ValueError):
        price_for(25)
