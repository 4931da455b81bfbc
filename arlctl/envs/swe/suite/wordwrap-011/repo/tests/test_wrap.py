from wordwrap import wrap


def test_short_width():
    assert wrap("one two three", 5) == ["one", "two", "three"]


def test_long_word_kept():
    assert wrap("abcdefgh x", 4) == ["abcdefgh", "x"]
