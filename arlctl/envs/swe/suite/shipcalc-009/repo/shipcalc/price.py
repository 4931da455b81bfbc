"""Prices."""

from shipcalc.brackets import BRACKETS, bracket_index


def price_for(weight):
    if weight <= 0:
        raise ValueError("weight must be positive")
    return BRACKETS[bracket_index(weight)][1]
