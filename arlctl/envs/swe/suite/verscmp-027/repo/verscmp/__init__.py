"""verscmp: compare dotted version strings."""

from verscmp.compare import latest, newer
from verscmp.parse import parse_version

__all__ = ["newer", "latest", "parse_version"]
