"""Area (shoelace formula) and perimeter."""

import math

from polyarea.edges import edges


def area(points):
    if len(points) < 3:
        return 0.0
    twice = 0.0
    for i in range(len(points) - 1):
        (x1, y1), (x2, y2) = points[i], points[i + 1]
        twice += x1 * y2 - x2 * y1
    return abs(twice) / 2.0


def perimeter(points):
    return sum(math.dist(a, b) for a, b in edges(points))
