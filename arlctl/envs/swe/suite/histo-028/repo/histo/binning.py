"""Which bin a value falls into."""


def bin_index(value, low, high, bins):
    if high == low:
        return 0
    width = (high - low) / bins
    return int((value - low) // width)
