"""htmlsafe: escaping text for HTML."""

from htmlsafe.escape import escape
from htmlsafe.tags import tag

__all__ = ["escape", "tag"]
