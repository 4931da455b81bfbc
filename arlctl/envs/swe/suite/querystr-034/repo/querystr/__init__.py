"""querystr: parse and build URL query strings."""

from querystr.build import build_query
from querystr.parse import parse_query

__all__ = ["parse_query", "build_query"]
