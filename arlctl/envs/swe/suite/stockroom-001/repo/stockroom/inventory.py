"""Items and the inventory that holds them."""

from dataclasses import dataclass


@dataclass
class Item:
    sku: str
    quantity: int
    reorder_at: int


class Inventory:
    def __init__(self):
        self._items = {}

    def add(self, sku, quantity, reorder_at=0):
        if quantity < 0:
            raise ValueError("quantity must be >= 0")
        self._items[sku] = Item(sku, quantity, reorder_at)

    def remove(self, sku, count):
        item = self._items[sku]
        if count > item.quantity:
            raise ValueError(f"only {item.quantity} of {sku} in stock")
        item.quantity -= count

    def items(self):
        return list(self._items.values())

    def __len__(self):
        return len(self._items)
