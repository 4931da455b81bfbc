"""dotenvx: parse .env files."""

from dotenvx.parser import parse

__all__ = ["parse"]
