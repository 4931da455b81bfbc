"""Do two closed intervals overlap (touching counts)?"""


def overlaps(a, b):
    return a[0] <= b[1] and b[0] <= a[1]
