"""Kelvin."""


def c_to_k(c):
    return c + 273.15


def k_to_c(k):
    if k < 0:
        raise ValueError("below absolute zero")
    return k - 273.15
