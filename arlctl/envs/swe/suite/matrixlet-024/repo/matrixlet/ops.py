"""Transpose and product."""

from matrixlet.shape import shape


def transpose(m):
    rows, cols = shape(m)
    return [[m[j][i] for j in range(cols)] for i in range(rows)]


def matmul(a, b):
    (ar, ac), (br, bc) = shape(a), shape(b)
    if ac != br:
        raise ValueError("shapes do not align")
    bt = transpose(b)
    return [[sum(x * y for x, y in zip(row, col)) for col in bt] for row in a]
