from romanum import from_roman, to_roman


def test_small():
    assert [to_roman(n) for n in (1, 4, 9, 14, 40)] == ["I", "IV", "IX", "XIV", "XL"]


def test_parse():
    assert from_roman("MCMXCIV") == 1994
