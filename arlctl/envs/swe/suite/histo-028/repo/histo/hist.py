"""Counts per bin between the data's min and max."""

from histo.binning import bin_index


def histogram(values, bins=10):
    if bins < 1:
        raise ValueError("bins must be >= 1")
    values = list(values)
    counts = [0] * bins
    if not values:
        return counts
    low, high = min(values), max(values)
    for v in values:
        counts[bin_index(v, low, high, bins)] += 1
    return counts
