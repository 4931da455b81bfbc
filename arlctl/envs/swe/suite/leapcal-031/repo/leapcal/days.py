"""Days per month and day of year."""

from leapcal.leap import is_leap

DAYS = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]


def days_in_month(year, month):
    if not 1 <= month <= 12:
        raise ValueError("month must be 1..12")
    return 29 if month == 2 and is_leap(year) else DAYS[month - 1]


def day_of_year(year, month, day):
    return sum(days_in_month(year, m) for m in range(1, month)) + day
