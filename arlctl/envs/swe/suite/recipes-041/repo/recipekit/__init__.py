"""recipekit: scale ingredient amounts."""

from recipekit.scale import scale
from recipekit.units import pretty

__all__ = ["scale", "pretty"]
