"""Validation."""

from phonecheck.patterns import PHONE


def is_valid(text):
    return PHONE.match(text.strip()) is not None
