"""Argument checks."""


def positive_size(size):
    if not isinstance(size, int) or size < 1:
        raise ValueError("size must be a positive int")
    return size
