"""leapcal: Gregorian calendar arithmetic."""

from leapcal.days import day_of_year, days_in_month
from leapcal.leap import is_leap

__all__ = ["is_leap", "days_in_month", "day_of_year"]
