from payroll import weekly_pay


def test_part_time():
    assert weekly_pay(20, 10) == 200


def test_exactly_regular():
    assert weekly_pay(40, 10) == 400
