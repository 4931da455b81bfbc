"""Coupons: a code and a percentage off (10 means 10%)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Coupon:
    code: str
    percent: float

    def __post_init__(self):
        if not 0 <= self.percent <= 100:
            raise ValueError("percent must be within 0..100")

    def discount_on(self, amount):
        return amount * self.percent
