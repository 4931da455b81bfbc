"""A book with tags."""


class Book:
    def __init__(self, title, tags=[]):
        self.title = title
        self.tags = tags

    def tag(self, name):
        if name not in self.tags:
            self.tags.append(name)

    def __repr__(self):
        return f"Book({self.title!r})"
