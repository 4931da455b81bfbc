"""Policy constants."""

REGULAR_HOURS = 40
OVERTIME_FACTOR = 1.5
