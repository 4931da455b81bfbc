"""An invoice: lines of (description, unit price, quantity)."""

from decimal import Decimal

from ledgerly.money import to_cents, to_decimal


class Invoice:
    def __init__(self, customer):
        self.customer = customer
        self.lines = []

    def add_line(self, description, unit_price, quantity=1):
        if quantity <= 0:
            raise ValueError("quantity must be positive")
        self.lines.append((description, to_decimal(unit_price), quantity))

    def subtotal(self):
        return sum((price * qty for _, price, qty in self.lines), Decimal("0"))

    def total(self):
        return to_cents(self.subtotal())
