"""Merge overlapping intervals."""

from spans.overlap import overlaps


def merge(intervals):
    out = []
    for start, end in intervals:
        if out and overlaps(out[-1], (start, end)):
            out[-1] = (min(out[-1][0], start), max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def total_length(intervals):
    return sum(end - start for start, end in merge(intervals))
