"""Shift letters, keep everything else."""

from caesarx.alphabet import base_of


def shift(text, k):
    out = []
    for ch in text:
        if ch.isascii() and ch.isalpha():
            base = base_of(ch)
            out.append(chr(base + (ord(ch) - base + k) % 26))
        else:
            out.append(ch)
    return "".join(out)


def rot13(text):
    return shift(text, 13)
