from querystr import build_query, parse_query


def test_multi():
    assert parse_query("a=1&a=2&b=3") == {"a": ["1", "2"], "b": ["3"]}


def test_build():
    assert build_query({"q": ["a b"]}) == "q=a+b"
