"""polyarea: polygon measurements."""

from polyarea.measure import area, perimeter

__all__ = ["area", "perimeter"]
