import pytest

from bankline import Account, InsufficientFunds, transfer


def test_deposit_withdraw():
    acc = Account("ann", 100)
    acc.deposit(50)
    acc.withdraw(30)
    assert acc.balance == 120


def test_overdraw():
    with pytest.raises(InsufficientFunds):
        Account("bob", 10).withdraw(11)


def test_transfer_ok():
    a, b = Account("a", 100), Account("b", 0)
    transfer(a, b, 40)
    assert (a.balance, b.balance) == (60, 40)
