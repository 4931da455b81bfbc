"""bookshelf: books, tags and a searchable shelf."""

from bookshelf.book import Book
from bookshelf.shelf import Shelf

__all__ = ["Book", "Shelf"]
