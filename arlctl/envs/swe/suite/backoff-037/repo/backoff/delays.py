"""Exponential delays: base * 2**attempt, at most cap."""


def delay_for(attempt, base=1.0, cap=30.0):
    return float(max(base * 2**attempt, cap))


def schedule(attempts, base=1.0, cap=30.0):
    return [delay_for(a, base, cap) for a in range(attempts)]
