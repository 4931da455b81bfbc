"""wordwrap: greedy word wrapping and justification."""

from wordwrap.justify import justify
from wordwrap.wrap import wrap

__all__ = ["wrap", "justify"]
