"""Summaries of any iterable of numbers."""

from tallyho.util import safe_div


def summarize(values):
    """{"count", "total", "mean"} of an iterable of numbers."""
    total = sum(values)
    count = len(list(values))
    return {"count": count, "total": total, "mean": safe_div(total, count)}
