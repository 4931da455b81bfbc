from caesarx import rot13, shift


def test_lower():
    assert shift("xyz", 3) == "abc"


def test_rot13_lower_roundtrip():
    assert rot13(rot13("hello, world")) == "hello, world"
