from phonecheck import is_valid, normalize


def test_valid():
    assert is_valid("555-123-4567")
    assert is_valid("+44 555 123 4567")


def test_invalid():
    assert not is_valid("12-34")


def test_normalize():
    assert normalize("555 123 4567") == "+15551234567"
