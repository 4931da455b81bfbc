"""natsort_lite: natural sort of strings with numbers."""

from natsort_lite.sorting import natural_key, natural_sorted

__all__ = ["natural_sorted", "natural_key"]
