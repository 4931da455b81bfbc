"""matrixlet: small list-of-lists matrices."""

from matrixlet.ops import matmul, transpose
from matrixlet.shape import shape

__all__ = ["transpose", "matmul", "shape"]
