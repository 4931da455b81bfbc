"""cartwise: a shopping cart with coupons."""

from cartwise.cart import Cart
from cartwise.coupons import Coupon

__all__ = ["Cart", "Coupon"]
