"""Bit helpers."""


def contains_any(value, mask):
    return bool(value & mask)


def contains_all(value, mask):
    return value & mask == mask
