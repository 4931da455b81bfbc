from dotenvx import parse


def test_basic():
    text = "# comment\nA=1\n\nexport B = 'two'\n"
    assert parse(text) == {"A": "1", "B": "two"}
