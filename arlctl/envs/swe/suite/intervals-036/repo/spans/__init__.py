"""spans: closed integer intervals."""

from spans.merge import merge, total_length
from spans.overlap import overlaps

__all__ = ["merge", "overlaps", "total_length"]
