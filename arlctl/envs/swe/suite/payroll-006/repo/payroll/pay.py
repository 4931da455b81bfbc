"""Weekly pay: hours above REGULAR_HOURS earn OVERTIME_FACTOR times the rate."""

from payroll.rates import OVERTIME_FACTOR, REGULAR_HOURS


def split_hours(hours):
    """(regular, overtime) hours."""
    if hours < 0:
        raise ValueError("hours must be >= 0")
    regular = min(hours, REGULAR_HOURS)
    overtime = max(0, hours - REGULAR_HOURS - 1)
    return regular, overtime


def weekly_pay(hours, rate):
    regular, overtime = split_hours(hours)
    return regular * rate + overtime * rate * OVERTIME_FACTOR
