"""Chunking."""

from chunker.checks import positive_size


def chunks(seq, size):
    size = positive_size(size)
    return [list(seq[i : i + size]) for i in range(0, len(seq) - size + 1, size)]


def batched_sum(seq, size):
    return [sum(c) for c in chunks(seq, size)]
