"""Natural ordering: digit runs compare as numbers, text case-insensitively."""

from natsort_lite.chunks import runs


def natural_key(text):
    return [(0, part.lower(), "") for part in runs(text)]


def natural_sorted(items):
    return sorted(items, key=natural_key)
