"""Raw moments."""


def mean(values):
    values = list(values)
    return sum(values) / len(values)
