from leapcal import day_of_year, days_in_month, is_leap


def test_common_leap():
    assert is_leap(2024) and not is_leap(2023) and not is_leap(1900)


def test_feb():
    assert days_in_month(2024, 2) == 29


def test_doy():
    assert day_of_year(2023, 3, 1) == 60
