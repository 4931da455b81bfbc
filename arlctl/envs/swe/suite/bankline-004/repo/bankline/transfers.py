"""Moving money between accounts."""


def transfer(source, target, cents):
    """Move cents from source to target; all or nothing."""
    target.deposit(cents)
    source.withdraw(cents)
