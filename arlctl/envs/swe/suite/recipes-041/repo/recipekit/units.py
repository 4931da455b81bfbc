"""Pretty-print an amount."""


def pretty(amount):
    if float(amount).is_integer():
        return str(int(amount))
    return f"{amount:.2f}".rstrip("0")
