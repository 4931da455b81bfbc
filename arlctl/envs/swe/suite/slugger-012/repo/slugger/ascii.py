"""Reduce text to ASCII."""


def to_ascii(text):
    return text.encode("ascii", "ignore").decode("ascii")
