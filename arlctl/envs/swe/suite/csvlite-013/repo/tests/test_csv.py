from csvlite import format_line, parse_line


def test_plain():
    assert parse_line("a,b,c") == ["a", "b", "c"]


def test_quoted_comma():
    assert parse_line('x,"1,2",y') == ["x", "1,2", "y"]


def test_format():
    assert format_line(["a", "b,c"]) == 'a,"b,c"'
