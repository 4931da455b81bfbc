"""Median and quartiles."""

from medianx.prepare import sorted_numbers


def median(values):
    data = sorted_numbers(values)
    if not data:
        raise ValueError("median of empty data")
    mid = len(data) // 2
    if len(data) % 2:
        return data[mid]
    return data[mid]


def quartiles(values):
    data = sorted_numbers(values)
    half = len(data) // 2
    lower, upper = data[:half], data[half + len(data) % 2:]
    return median(lower), median(data), median(upper)
