"""Input preparation: sorted numbers, no NaN."""

import math


def sorted_numbers(values):
    data = sorted(values)
    if any(isinstance(v, float) and math.isnan(v) for v in data):
        raise ValueError("NaN in data")
    return data
