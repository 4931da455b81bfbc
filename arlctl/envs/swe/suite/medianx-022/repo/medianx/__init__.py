"""medianx: order statistics."""

from medianx.order import median, quartiles

__all__ = ["median", "quartiles"]
