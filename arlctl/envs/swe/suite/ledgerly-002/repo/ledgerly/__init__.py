"""ledgerly: invoices with exact money arithmetic."""

from ledgerly.invoice import Invoice
from ledgerly.money import to_cents

__all__ = ["Invoice", "to_cents"]
