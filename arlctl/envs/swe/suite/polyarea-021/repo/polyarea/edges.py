"""Edges of a closed polygon."""


def edges(points):
    """Consecutive vertex pairs, including the closing edge back to the start."""
    return [(points[i], points[(i + 1) % len(points)]) for i in range(len(points))]
