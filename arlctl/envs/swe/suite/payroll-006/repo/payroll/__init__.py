"""payroll: weekly pay with overtime."""

from payroll.pay import weekly_pay
from payroll.rates import OVERTIME_FACTOR, REGULAR_HOURS

__all__ = ["weekly_pay", "REGULAR_HOURS", "OVERTIME_FACTOR"]
