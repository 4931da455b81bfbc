import pytest

from stockroom import Inventory, needs_reorder


def test_add_and_remove():
    inv = Inventory()
    inv.add("nut", 10)
    inv.remove("nut", 3)
    assert inv.items()[0].quantity == 7


def test_remove_too_many():
    inv = Inventory()
    inv.add("nut", 1)
    with pytest.raises(ValueError):
        inv.remove("nut", 2)


def test_reorder_low_items():
    inv = Inventory()
    inv.add("a", 1, reorder_at=3)
    inv.add("b", 9, reorder_at=3)
    assert needs_reorder(inv) == ["a"]
