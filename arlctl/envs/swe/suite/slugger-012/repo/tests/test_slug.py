from slugger import slugify, unique_slug


def test_basic():
    assert slugify("Hello, World!") == "hello-world"


def test_unique():
    assert unique_slug("a b", {"a-b", "a-b-2"}) == "a-b-3"
