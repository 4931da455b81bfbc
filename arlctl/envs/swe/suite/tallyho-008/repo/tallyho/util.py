"""Small arithmetic helpers."""


def safe_div(a, b):
    return float(a) / b if b else 0.0
