import pytest

from cartwise import Cart, Coupon


def test_subtotal():
    cart = Cart()
    cart.add("apple", 0.5, 4)
    cart.add("apple", 0.5, 2)
    assert cart.subtotal() == 3.0


def test_bad_coupon():
    with pytest.raises(ValueError):
        Coupon("X", percent=150)
