"""bankline: accounts and transfers."""

from bankline.accounts import Account, InsufficientFunds
from bankline.transfers import transfer

__all__ = ["Account", "InsufficientFunds", "transfer"]
