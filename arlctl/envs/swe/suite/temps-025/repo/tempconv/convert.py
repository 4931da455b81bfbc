"""Conversions between C, F and K."""

from tempconv.kelvin import c_to_k, k_to_c


def c_to_f(c):
    return c * 9 / 5 + 32


def f_to_c(f):
    return f - 32 * 5 / 9


def convert(value, src, dst):
    to_c = {"C": lambda v: v, "F": f_to_c, "K": k_to_c}[src]
    from_c = {"C": lambda v: v, "F": c_to_f, "K": c_to_k}[dst]
    return from_c(to_c(value))
