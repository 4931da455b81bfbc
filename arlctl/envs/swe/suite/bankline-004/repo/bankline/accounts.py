"""Accounts hold an integer balance in cents."""


class InsufficientFunds(Exception):
    pass


class Account:
    def __init__(self, owner, balance=0):
        self.owner = owner
        self.balance = balance
        self.history = []

    def deposit(self, cents):
        if cents <= 0:
            raise ValueError("deposit must be positive")
        self.balance += cents
        self.history.append(("deposit", cents))

    def withdraw(self, cents):
        if cents > self.balance:
            raise InsufficientFunds(f"{self.owner} has {self.balance}, needs {cents}")
        self.balance -= cents
        self.history.append(("withdraw", cents))
