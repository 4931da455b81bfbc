"""spreadx: dispersion statistics."""

from spreadx.dispersion import stdev, variance

__all__ = ["variance", "stdev"]
