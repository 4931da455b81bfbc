"""Variance and standard deviation. By default the sample estimate (ddof=1) is returned."""

import math

from spreadx.moments import mean


def variance(values, ddof=1):
    values = list(values)
    if len(values) <= ddof:
        raise ValueError("not enough data")
    m = mean(values)
    return sum((v - m) ** 2 for v in values) / (len(values) - ddof)


def stdev(values, ddof=0):
    return math.sqrt(variance(values, ddof))
