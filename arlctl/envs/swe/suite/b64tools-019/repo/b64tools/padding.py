"""Base64 padding helpers."""


def strip_padding(text):
    return text.rstrip("=")


def add_padding(text):
    return text + "=" * (-len(text) % 4)
