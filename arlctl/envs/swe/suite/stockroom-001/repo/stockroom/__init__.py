"""stockroom: a tiny inventory tracker."""

from stockroom.inventory import Inventory, Item
from stockroom.reorder import needs_reorder

__all__ = ["Inventory", "Item", "needs_reorder"]
