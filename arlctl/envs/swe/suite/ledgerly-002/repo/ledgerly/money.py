"""Money helpers: amounts are Decimal, rounded to whole cents."""

from decimal import ROUND_HALF_EVEN, Decimal

CENT = Decimal("0.01")


def to_decimal(value):
    return value if isinstance(value, Decimal) else Decimal(str(value))


def to_cents(value):
    """Round an amount to whole cents (half-up, as accounting expects)."""
    return to_decimal(value).quantize(CENT, rounding=ROUND_HALF_EVEN)
