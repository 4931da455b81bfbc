"""csvlite: a small CSV line parser and writer."""

from csvlite.parse import parse_line
from csvlite.write import format_line

__all__ = ["parse_line", "format_line"]
