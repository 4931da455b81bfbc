from bookshelf import Book, Shelf


def test_explicit_tags():
    shelf = Shelf()
    shelf.add(Book("Dune", ["scifi"]))
    shelf.add(Book("Emma", ["classic"]))
    assert shelf.tagged("scifi") == ["Dune"]
