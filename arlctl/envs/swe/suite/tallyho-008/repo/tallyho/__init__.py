"""tallyho: summaries of number streams."""

from tallyho.summary import summarize

__all__ = ["summarize"]
