"""Letter helpers."""


def base_of(ch):
    """Code point of 'a' or 'A' for the letter's case."""
    return ord("a") if ch.isalpha() else ord("A")
