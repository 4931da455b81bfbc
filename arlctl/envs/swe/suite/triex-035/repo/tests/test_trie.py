from triex import Trie


def test_insert_contains():
    t = Trie()
    t.insert("cart")
    assert t.contains("cart")
    assert not t.contains("dog")


def test_complete():
    t = Trie()
    for w in ("car", "cart", "cat"):
        t.insert(w)
    assert t.complete("car") == ["car", "cart"]
