"""Comparisons."""

from verscmp.parse import parse_version


def _padded(parts, n):
    return parts + ("0",) * (n - len(parts))


def newer(a, b):
    pa, pb = parse_version(a), parse_version(b)
    n = max(len(pa), len(pb))
    return _padded(pa, n) > _padded(pb, n)


def latest(versions):
    best = versions[0]
    for v in versions[1:]:
        if newer(v, best):
            best = v
    return best
