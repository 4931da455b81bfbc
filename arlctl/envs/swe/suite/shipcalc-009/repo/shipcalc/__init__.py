"""shipcalc: shipping price by weight bracket."""

from shipcalc.price import price_for

__all__ = ["price_for"]
