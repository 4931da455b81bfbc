from htmlsafe import escape, tag


def test_ampersand():
    assert escape("fish & chips") == "fish &amp; chips"


def test_tag_plain():
    assert tag("b", "hi", id="x") == '<b id="x">hi</b>'
