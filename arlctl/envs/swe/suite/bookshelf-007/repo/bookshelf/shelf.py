"""A shelf of books searchable by tag."""


class Shelf:
    def __init__(self):
        self.books = []

    def add(self, book):
        self.books.append(book)

    def tagged(self, name):
        return [b.title for b in self.books if name in b.tags]
