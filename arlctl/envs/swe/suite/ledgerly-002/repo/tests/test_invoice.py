from decimal import Decimal

from ledgerly import Invoice


def test_total_simple():
    inv = Invoice("acme")
    inv.add_line("widget", "1.50", 2)
    inv.add_line("gadget", "0.25", 4)
    assert inv.total() == Decimal("4.00")


def test_empty_invoice():
    assert Invoice("x").total() == Decimal("0.00")
