"""Conversion both ways."""

from romanum.table import SYMBOLS, VALUES


def to_roman(number):
    if not 0 < number < 4000:
        raise ValueError("out of range")
    out = ""
    for value, numeral in VALUES:
        while number >= value:
            out += numeral
            number -= value
    return out


def from_roman(text):
    total = 0
    for i, ch in enumerate(text):
        value = SYMBOLS[ch]
        if i + 1 < len(text) and SYMBOLS[text[i + 1]] > value:
            total -= value
        else:
            total += value
    return total
