from durfmt import format_duration, parse_duration


def test_minutes():
    assert format_duration(125) == "2m 5s"


def test_zero():
    assert format_duration(0) == "0s"


def test_parse():
    assert parse_duration("1h 30m") == 5400
